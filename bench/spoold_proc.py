"""Starting a spoold binary for the Python measurements in bench/
(edge_findings.py, search.py): a config on a free port, then wait until
it answers /readyz."""
import http.client
import os
import socket
import subprocess
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(binary, dir, server="", spool="", tables=""):
    """Runs `binary` on a spool in `dir` with these [server] and [spool]
    keys and tables; returns the process and its port once it is ready."""
    port = free_port()
    conf = os.path.join(dir, "spoold.toml")
    with open(conf, "w") as f:
        f.write(f'[server]\nlisten = "127.0.0.1:{port}"\n{server}\n'
                f'[spool]\ndir = "{dir}/spool"\n{spool}\n{tables}\n')
    p = subprocess.Popen([binary, "run", "--config", conf],
                         stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                return p, port
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("spoold never became ready")
