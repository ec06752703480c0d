"""AWS Powertools for Lambda (Python), its idempotency utility on its DynamoDB persistence layer,
measured at the client against the DynamoDB-compatible server of IDEM_TEST_DYNAMODB_URL: requests
(each HTTP attempt botocore sends), consumed capacity units as the server reports them, and
latency per first execution and per replay. Prints one JSON object (scripts/dynamodb-compare).

    python powertools.py OPERATIONS
"""

import json
import os
import sys
import time
import urllib.parse

import boto3
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)


def endpoint_and_region(url):
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    return query["endpoint"][0], query.get("region", ["us-east-1"])[0]


def main():
    operations = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    endpoint, region = endpoint_and_region(os.environ["IDEM_TEST_DYNAMODB_URL"])
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name=region)
    table = f"powertools-requests-{os.getpid()}"
    # The table Powertools' documentation asks for: partition key `id`, TTL on `expiration`.
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.update_time_to_live(
        TableName=table,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": "expiration"},
    )

    counted = {"requests": 0, "capacity": 0.0}

    def before_send(**_):
        counted["requests"] += 1

    def ask_capacity(params, **_):
        params["ReturnConsumedCapacity"] = "TOTAL"

    def after_call(parsed, **_):
        counted["capacity"] += float(parsed.get("ConsumedCapacity", {}).get("CapacityUnits", 0))

    events = client.meta.events
    events.register("before-send.dynamodb.*", before_send)
    events.register("before-parameter-build.dynamodb.*", ask_capacity)
    events.register("after-call.dynamodb.*", after_call)

    persistence = DynamoDBPersistenceLayer(table_name=table, boto3_client=client)
    config = IdempotencyConfig(expires_after_seconds=3600)

    @idempotent_function(data_keyword_argument="order", persistence_store=persistence, config=config)
    def create_order(order):
        return {"order_id": order["order"], "status": "created"}

    def take():
        taken = dict(counted)
        counted["requests"], counted["capacity"] = 0, 0.0
        return taken

    first, replay = [], []
    totals = {"first": [0, 0.0], "replay": [0, 0.0]}
    for i in range(operations):
        order = {"order": i, "amount": 42}
        take()
        t = time.perf_counter()
        create_order(order=order)
        first.append(time.perf_counter() - t)
        got = take()
        totals["first"][0] += got["requests"]
        totals["first"][1] += got["capacity"]
        t = time.perf_counter()
        create_order(order=order)
        replay.append(time.perf_counter() - t)
        got = take()
        totals["replay"][0] += got["requests"]
        totals["replay"][1] += got["capacity"]

    def pct(times, q):
        times = sorted(times)
        return times[round((len(times) - 1) * q)] * 1000

    def part(name, times):
        return {
            "requests": totals[name][0] / operations,
            "capacity_units": totals[name][1] / operations,
            "p50_ms": pct(times, 0.5),
            "p99_ms": pct(times, 0.99),
        }

    print(
        json.dumps(
            {
                "system": "Powertools for AWS Lambda (Python) idempotency, DynamoDB persistence",
                "operations": operations,
                "first_execution": part("first", first),
                "replay": part("replay", replay),
            }
        )
    )


if __name__ == "__main__":
    main()
