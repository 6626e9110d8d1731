"""Send, receive, ack and forward through the client that
openapi-python-client generates from docs/openapi.json (generate.sh); then
the event catalogue (a schema refusing a payload with 422), a paged queue
list, a tenant's scoped key and a portal session.

Environment: SPOOLD_URL, SPOOLD_API_KEY (an operator's), SPOOLD_OPEN_URL (a
server without keys), SPOOLD_TENANT_KEY
(tenant cus_smoke's), SPOOLD_SINK (a destination for the push queue),
SPOOLD_CLIENT_DIR (where generate.sh put the package); the server has a
portal.secret. Prints "ok <message id> <forwarded id>".
"""

import os
import sys

sys.path.insert(0, os.environ["SPOOLD_CLIENT_DIR"])

from spoold_client import AuthenticatedClient, Client  # noqa: E402
from spoold_client.api.events import publish_event, put_event_type  # noqa: E402
from spoold_client.api.forward import forward_by_header_post  # noqa: E402
from spoold_client.api.leases import ack, receive  # noqa: E402
from spoold_client.api.messages import send_message  # noqa: E402
from spoold_client.api.portal import create_portal_session, who_am_i  # noqa: E402
from spoold_client.api.queues import list_queues, put_queue  # noqa: E402
from spoold_client.models import (  # noqa: E402
    Capability,
    EventBody,
    EventBodyPayload,
    EventTypeDef,
    SessionRequest,
    SettingsBody,
    StoredBody,
)
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

    forwarded = forward(client, "generated-py-hooks", b"from python")
    unkeyed()
    scoped(client)
    print("ok", message_id, forwarded.parsed.id)


def forward(client: Client | AuthenticatedClient, queue: str, payload: bytes):
    """Forwards `payload` to a path of several segments and a query, given
    in the header that generated clients can send (they percent-encode a
    path parameter)."""
    forwarded = forward_by_header_post.sync_detailed(
        queue, client=client, body=File(payload=payload), spooler_forward_path="/v1/charges?x=1"
    )
    assert forwarded.status_code == 202, forwarded.content
    return forwarded


def unkeyed() -> None:
    """A server without keys takes calls without a token."""
    client = Client(base_url=os.environ["SPOOLD_OPEN_URL"])
    made = put_queue.sync_detailed(
        "open-hooks", client=client, body=SettingsBody(destination=os.environ["SPOOLD_SINK"])
    )
    assert made.status_code in (200, 201), made.content
    forward(client, "open-hooks", b"from python, no key")


def scoped(client: AuthenticatedClient) -> None:
    """The catalogue, paging, a tenant's key and a portal session."""
    schema = {"type": "object", "required": ["amount"]}
    defined = put_event_type.sync_detailed(
        "smoke.paid", client=client, body=EventTypeDef(description="paid", schema=schema)
    )
    assert defined.status_code in (200, 201), defined.content
    bad = publish_event.sync_detailed(
        client=client, body=EventBody(type_="smoke.paid", payload=EventBodyPayload.from_dict({}))
    )
    assert bad.status_code == 422 and b"schema_mismatch" in bad.content, bad.content

    page = list_queues.sync_detailed(client=client, limit=1)
    assert page.status_code == 200 and len(page.parsed.queues) == 1, page.content
    assert isinstance(page.parsed.next_, str), page.content

    tenant = AuthenticatedClient(
        base_url=os.environ["SPOOLD_URL"], token=os.environ["SPOOLD_TENANT_KEY"]
    )
    made = put_queue.sync_detailed(
        "cus_smoke-py", client=tenant, body=SettingsBody(destination=os.environ["SPOOLD_SINK"])
    )
    assert made.status_code in (200, 201) and made.parsed.settings.tenant == "cus_smoke", made.content
    mine = list_queues.sync_detailed(client=tenant)
    names = [q.name for q in mine.parsed.queues]
    assert names == ["cus_smoke-py", "cus_smoke-py.failed"], names

    link = create_portal_session.sync_detailed(
        client=client,
        body=SessionRequest(tenant="cus_smoke", ttl_seconds=600, capabilities=[Capability.READ]),
    )
    assert link.status_code == 201 and "/portal/#token=" in link.parsed.url, link.content
    session = AuthenticatedClient(base_url=os.environ["SPOOLD_URL"], token=link.parsed.token)
    who = who_am_i.sync_detailed(client=session)
    assert who.parsed.tenant == "cus_smoke" and who.parsed.may == ["read"], who.content
    seen = list_queues.sync_detailed(client=session)
    assert [q.name for q in seen.parsed.queues] == names, seen.content


if __name__ == "__main__":
    main()
