"""Every example in docs/openapi.json is valid against its schema (JSON
Schema 2020-12, as OpenAPI 3.1 says), so that the examples client
generators and readers copy do not lie. jsonschema comes with
openapi-spec-validator."""

import json
import sys

import jsonschema
from referencing import Registry, Resource

path = sys.argv[1] if len(sys.argv) > 1 else "docs/openapi.json"
doc = json.load(open(path))
registry = Registry().with_resource("urn:doc", Resource.from_contents(doc, default_specification=jsonschema.Draft202012Validator.META_SCHEMA and __import__("referencing.jsonschema").jsonschema.DRAFT202012))

def check(schema, example, where):
    schema = json.loads(json.dumps(schema).replace('"#/components', '"urn:doc#/components'))
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    errors = sorted(validator.iter_errors(example), key=str)
    for e in errors:
        print(f"{where}: {e.message} at {list(e.absolute_path)}")
    return not errors

ok = True
checked = 0
for p, item in doc["paths"].items():
    for method, op in item.items():
        where = f"{method.upper()} {p}"
        for param in op.get("parameters", []):
            if "example" in param:
                ok &= check(param["schema"], param["example"], f"{where} {param['name']}")
                checked += 1
        media = list(op.get("requestBody", {}).get("content", {}).items())
        for status, response in op["responses"].items():
            media += [(f"{status} {t}", m) for t, m in response.get("content", {}).items()]
        for name, m in media:
            if "example" in m and "schema" in m:
                ok &= check(m["schema"], m["example"], f"{where} {name}")
                checked += 1
print(f"{checked} examples checked")
sys.exit(0 if ok else 1)
