"""The tutorial runner: the plain regression script a team writes from the Perplexity tutorial.

It stands for what a team runs before adopting agent-regression, and is the yardstick the
start-up and live fixed-cost benchmarks hold `regression.py` to: it imports the `perplexity`
SDK at the top (as the tutorial does), builds a client from PERPLEXITY_API_KEY (and
PERPLEXITY_BASE_URL, which the SDK reads), loops over a few cases calling
`client.chat.completions.create`, checks each answer for an expected word and writes the
results to a JSON file. Nothing more: no record, no fsync, no retries policy, no summary.

    python bench/tutorial_runner.py [--out results.json]
    python bench/tutorial_runner.py --dry-run    # everything before the first request, then exit

`--dry-run` stands for how a tutorial script starts: interpreter, SDK import, client, the
case list printed; it sends nothing. The 4 cases ask the built-in suite's questions, so a
live run sends as many requests as `regression.py`'s default run for one model.
"""

import argparse
import json

from perplexity import Perplexity

MODEL = "sonar"
SYSTEM = "Name the HTTP status code the log shows and the next action. Answer in one line."
CASES = [
    {"id": "rate-limit", "expect": "429",
     "question": "GET /v1/payments/pay_8f3\nResponse: 429; Retry-After: 30"},
    {"id": "temporary-overload", "expect": "503",
     "question": "GET /v1/payments/pay_8f3\nResponse: 503; no Retry-After"},
    {"id": "failed-precondition", "expect": "412",
     "question": 'PUT /v1/orders/ord_21; If-Match: "v7"\nResponse: 412'},
    {"id": "ambiguous-payment", "expect": "unknown",
     "question": "POST /v1/payments; no response after 30s; outcome not reconciled"},
]


def main():
    parser = argparse.ArgumentParser(description="Run the cases against Perplexity.")
    parser.add_argument("--out", default="results.json")
    parser.add_argument("--dry-run", action="store_true", help="list the cases, send nothing")
    args = parser.parse_args()
    client = Perplexity()
    if args.dry_run:
        for case in CASES:
            print(case["id"])
        return 0
    results = []
    for case in CASES:
        completion = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": case["question"]}],
        )
        answer = completion.choices[0].message.content
        results.append({"id": case["id"], "answer": answer, "passed": case["expect"] in answer})
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=2)
    failed = [result["id"] for result in results if not result["passed"]]
    print(f"{len(results) - len(failed)}/{len(results)} passed"
          + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
