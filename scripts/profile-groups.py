#!/usr/bin/env python3
"""Groups a folded profile (inferno-collapse-perf --all) by who does the work, per thread.

Allocation and copying are counted where they happen (the leaf frame); every other sample goes
to the innermost frame that belongs to a known component (ed25519, the ledger, redb, quinn...).
Counts are perf's periods: with the cpu-clock event, nanoseconds of CPU.
"""
import collections
import re
import sys

LEAF = [
    ("the allocator (malloc, free, realloc)",
     r"malloc|free|realloc|_int_|unlink_chunk|tcache|calloc|arena_for_chunk"),
    ("memcpy / memcmp / memmove", r"memmove|memcpy|memcmp|memset"),
]
OWNERS = [
    ("ed25519 signatures (curve25519, sha512)", r"curve25519|ed25519|sha2::|sha512"),
    ("Abhyasa: ledger machines", r"abhyasa_ledger"),
    ("the kernel (fdatasync, UDP, scheduler, wake-ups)", r"_\[k\]$"),
    ("redb", r"redb::"),
    ("quinn, rustls, ring", r"quinn|rustls|\bring::|ring_core"),
    ("CBOR (ciborium, serde)", r"ciborium|serde::|serde_"),
    ("Abhyasa: store rows and group commit", r"abhyasa_store"),
    ("Abhyasa: custody machines", r"abhyasa_custody"),
    ("Abhyasa: node core and sessions", r"abhyasa_node|abhyasa_moq"),
    ("Abhyasa: wire", r"abhyasa_wire"),
    ("tokio", r"tokio::"),
]


def group(frames):
    for name, pat in LEAF:
        if re.search(pat, frames[-1]):
            return name
    for f in reversed(frames):
        for name, pat in OWNERS:
            if re.search(pat, f):
                return name
    return "other (std, benchmark driver)"


def main(path):
    by_thread = collections.defaultdict(collections.Counter)
    for line in open(path):
        stack, _, n = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        thread = re.sub(r"-[0-9a-f]{4,}$", "", frames[0])
        by_thread[thread][group(frames)] += int(n)
        by_thread["(all threads)"][group(frames)] += int(n)
    for thread, counts in sorted(by_thread.items()):
        total = sum(counts.values())
        print(f"\n{thread}: {total / 1e9:.2f} s of CPU")
        print("| where | share |\n|---|---:|")
        for name, n in counts.most_common():
            print(f"| {name} | {100 * n / total:.1f}% |")


if __name__ == "__main__":
    main(sys.argv[1])
