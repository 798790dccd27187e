"""Scrapes a node's /metrics as Prometheus would and parses it with the reference Python
parser (prometheus_client.parser), printing the samples as one JSON line for the Rust test
to check against the node's status. Also checks that a scrape without the key is refused.

argv: <abhyasa binary> <work dir> <metrics url> <token file>
"""
import json
import sys
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

url, token_file = sys.argv[3], sys.argv[4]
token = open(token_file).read().strip()

try:
    urllib.request.urlopen(url, timeout=10)
    print("a scrape without the key was answered")
    sys.exit(1)
except urllib.error.HTTPError as e:
    assert e.code == 401, e.code

request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
with urllib.request.urlopen(request, timeout=10) as r:
    content_type = r.headers.get("content-type")
    text = r.read().decode()
assert content_type.startswith("text/plain; version=0.0.4"), content_type

samples = []
for family in text_string_to_metric_families(text):
    for s in family.samples:
        samples.append(
            {
                "family": family.name,
                "type": family.type,
                "name": s.name,
                "labels": s.labels,
                "value": s.value,
            }
        )
print("SAMPLES " + json.dumps(samples))
