// BullMQ beside spoold's push (bench/run.sh section `bullmq`): what a Node
// team would run instead of spoold, on Redis with `appendfsync always`.
//
//   node push.mjs producer --redis PORT --sink PORT --messages N [--clients 64] [--body 1024] [--rate R]
//   node push.mjs worker --redis PORT --sink PORT [--concurrency 64]
//
// The producer is the application and the destination in one process, as
// examples/load.rs `push` is for spoold: `clients` loops each add a job
// (`Queue.add`, answered once Redis has written and fsynced it) carrying
// the instant it was issued (with `--rate`, job i is added i / R seconds
// after the start and timed from then, as examples/load.rs does); the
// destination records each job's first
// arrival against the same clock. The worker is BullMQ's `Worker`, which
// posts every job's body to the destination with a keep-alive agent and
// completes the job on a 2xx (removed on completion, as an ack removes a
// message from spoold). The producer prints one `RESULT key=value ...` line
// when every job has arrived; the script measures Redis's and the
// worker's CPU from /proc.
import http from "node:http";
import { performance } from "node:perf_hooks";
import { Queue, Worker } from "bullmq";

const QUEUE = "hooks";

function options(argv) {
  const out = { clients: 64, body: 1024, concurrency: 64 };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "");
    out[key] = Number(argv[i + 1]);
  }
  for (const key of ["redis", "sink"]) {
    if (!out[key]) throw new Error(`--${key} is required`);
  }
  return out;
}

async function producer(o) {
  if (!o.messages) throw new Error("--messages is required");
  const arrivals = new Map(); // job id -> arrival (ms since this process began)
  const sent = new Map(); // job id -> issued (ms)
  let allArrived;
  const done = new Promise((resolve) => (allArrived = resolve));
  const sink = http.createServer((req, res) => {
    const arrived = performance.now();
    req.resume();
    req.on("end", () => {
      const id = req.headers["x-bench-id"];
      if (id !== undefined && !arrivals.has(id)) {
        arrivals.set(id, arrived);
        if (arrivals.size === o.messages) allArrived();
      }
      res.writeHead(200, { "content-length": "2" });
      res.end("ok");
    });
  });
  sink.keepAliveTimeout = 60_000;
  await new Promise((resolve) => sink.listen(o.sink, "127.0.0.1", resolve));

  const queue = new Queue(QUEUE, { connection: { host: "127.0.0.1", port: o.redis } });
  await queue.waitUntilReady();
  const body = "x".repeat(o.body);
  let next = 0;
  const started = performance.now();
  const client = async () => {
    while (next < o.messages) {
      const i = next++;
      const id = String(i);
      let issued = performance.now();
      if (o.rate) {
        const due = started + (i * 1000) / o.rate;
        if (due > issued) await new Promise((resolve) => setTimeout(resolve, due - issued));
        issued = due;
      }
      await queue.add("hook", { id, body }, {
        removeOnComplete: true,
        removeOnFail: true,
        attempts: 5,
        backoff: { type: "exponential", delay: 100 },
      });
      sent.set(id, issued);
    }
  };
  await Promise.all(Array.from({ length: o.clients }, client));
  const acceptSeconds = (performance.now() - started) / 1000;
  await done;
  let last = 0;
  const latencies = [];
  for (const [id, arrived] of arrivals) {
    last = Math.max(last, arrived);
    latencies.push(arrived - sent.get(id));
  }
  latencies.sort((a, b) => a - b);
  const pct = (p) => latencies[Math.floor((latencies.length - 1) * p)];
  const seconds = (last - started) / 1000;
  console.log(
    `RESULT bullmq_msgs=${o.messages} bullmq_accepted_per_s=${(o.messages / acceptSeconds).toFixed(0)}` +
      ` bullmq_delivered_per_s=${(o.messages / seconds).toFixed(0)}` +
      ` bullmq_p50_ms=${pct(0.5).toFixed(1)} bullmq_p99_ms=${pct(0.99).toFixed(1)}`,
  );
  await queue.close();
  sink.close();
  process.exit(0);
}

async function worker(o) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: o.concurrency });
  const post = (job) =>
    new Promise((resolve, reject) => {
      const req = http.request(
        {
          host: "127.0.0.1",
          port: o.sink,
          path: "/in",
          method: "POST",
          agent,
          headers: {
            "content-type": "application/octet-stream",
            "content-length": Buffer.byteLength(job.data.body),
            "x-bench-id": job.data.id,
          },
        },
        (res) => {
          res.resume();
          res.on("end", () =>
            res.statusCode >= 200 && res.statusCode < 300
              ? resolve()
              : reject(new Error(`destination answered ${res.statusCode}`)),
          );
        },
      );
      req.on("error", reject);
      req.end(job.data.body);
    });
  const w = new Worker(QUEUE, post, {
    connection: { host: "127.0.0.1", port: o.redis },
    concurrency: o.concurrency,
  });
  w.on("error", (e) => console.error(e));
  process.on("SIGTERM", async () => {
    await w.close(true);
    process.exit(0);
  });
}

const [mode, ...rest] = process.argv.slice(2);
const o = options(rest);
if (mode === "producer") await producer(o);
else if (mode === "worker") await worker(o);
else throw new Error(`unknown mode ${mode}: producer or worker`);
