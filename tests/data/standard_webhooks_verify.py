"""Checks deliveries with the official Standard Webhooks verifier
(`standardwebhooks` from PyPI), for tests/process/secret_rotation.rs.

Reads a JSON list of {"body", "headers", "secrets"} from standard input and
prints, for each delivery, which of its secrets the verifier accepts it
with: a JSON list of lists of booleans.
"""

import json
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

answers = []
for delivery in json.load(sys.stdin):
    accepted = []
    for secret in delivery["secrets"]:
        try:
            Webhook(secret).verify(delivery["body"], delivery["headers"])
            accepted.append(True)
        except WebhookVerificationError:
            accepted.append(False)
    answers.append(accepted)
print(json.dumps(answers))
