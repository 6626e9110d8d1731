"""Send, receive, ack and forward through the client that
openapi-python-client generates from docs/openapi.json (generate.sh).

Environment: SPOOLD_URL, SPOOLD_API_KEY, SPOOLD_SINK (a destination for the
push queue), SPOOLD_CLIENT_DIR (where generate.sh put the package).
Prints "ok <message id> <forwarded id>".
"""

import os
import sys

sys.path.insert(0, os.environ["SPOOLD_CLIENT_DIR"])

from spoold_client import AuthenticatedClient  # noqa: E402
from spoold_client.api.forward import forward_post  # noqa: E402
from spoold_client.api.leases import ack, receive  # noqa: E402
from spoold_client.api.messages import send_message  # noqa: E402
from spoold_client.api.queues import put_queue  # noqa: E402
from spoold_client.models import SettingsBody, StoredBody  # noqa: E402
from spoold_client.types import File  # noqa: E402


def main() -> None:
    # Spooler-Api-Key works on every route, /v1/forward too.
    client = AuthenticatedClient(
        base_url=os.environ["SPOOLD_URL"],
        token=os.environ["SPOOLD_API_KEY"],
        auth_header_name="Spooler-Api-Key",
        prefix="",
    )
    made = put_queue.sync_detailed("generated-py", client=client, body=SettingsBody(max_retries=3))
    assert made.status_code in (200, 201), made.content
    made = put_queue.sync_detailed(
        "generated-py-hooks",
        client=client,
        body=SettingsBody(destination=os.environ["SPOOLD_SINK"]),
    )
    assert made.status_code in (200, 201), made.content

    payload = b'{"order": 42, "from": "python"}'
    sent = send_message.sync_detailed(
        "generated-py", client=client, body=File(payload=payload, mime_type="application/json")
    )
    assert sent.status_code == 201 and isinstance(sent.parsed, StoredBody), sent.content
    message_id = sent.parsed.id

    got = receive.sync_detailed("generated-py", client=client)
    assert got.status_code == 200, got.content
    assert got.content == payload, got.content
    assert got.headers["spooler-message-id"] == message_id
    token = got.headers["spooler-lease-token"]
    acked = ack.sync_detailed("generated-py", token, client=client)
    assert acked.status_code == 204, acked.content

    forwarded = forward_post.sync_detailed(
        "generated-py-hooks", "charges", client=client, body=File(payload=b"from python")
    )
    assert forwarded.status_code == 202, forwarded.content
    print("ok", message_id, forwarded.parsed.id)


if __name__ == "__main__":
    main()
