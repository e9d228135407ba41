"""``ds ledger verify | show | prove | keygen | recover | sign-approval``: the run-ledger verbs of the ds CLI."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ds.interfaces.errors import DsError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ds ledger", description="Verify, show and prove a ds run ledger."
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser(
        "verify",
        help="check chain, Merkle tree heads and signatures; exit 1 if bad, 2 for bad input",
    )
    v.add_argument("path")
    v.add_argument("--public-key", default=None, help="hex Ed25519 key the heads must be signed by")
    v.add_argument(
        "--head",
        action="append",
        default=[],
        help="a trusted tree head (JSON, or @file) the ledger must extend",
    )
    v.add_argument(
        "--strict",
        action="store_true",
        help="also fail on unsigned heads, a missing .heads file, or records no signed head covers",
    )
    s = sub.add_parser("show", help="print records")
    s.add_argument("path")
    s.add_argument("--kind", default=None)
    s.add_argument("--last", type=int, default=None)
    s.add_argument("--json", action="store_true")
    pr = sub.add_parser("prove", help="print an inclusion or consistency proof (JSON)")
    pr.add_argument("path")
    pr.add_argument("what", choices=["inclusion", "consistency"])
    pr.add_argument("first", type=int, help="record index (inclusion) or old size (consistency)")
    pr.add_argument("second", type=int, nargs="?", default=None, help="tree size (default: all)")
    sub.add_parser("keygen", help="print a new Ed25519 signing key (hex) and its public key")
    sa = sub.add_parser(
        "sign-approval",
        help="print an approver's signature of intent INDEX (for MutationBoundary.approve)",
    )
    sa.add_argument("path")
    sa.add_argument("intent", type=int, help="the intent's record index")
    sa.add_argument("--approver", required=True, help="your name, as pinned in approver_keys")
    sa.add_argument("--key", required=True, help="your Ed25519 private key (64 hex or a key file)")
    rc = sub.add_parser(
        "recover",
        help="after the writer refused a ledger: keep it as evidence and start a new signed "
        "segment recording the break (exit 0; 2 for bad input or a wrong key)",
    )
    rc.add_argument("path")
    rc.add_argument(
        "--signing-key",
        default=None,
        help="the run's signing key (64 hex or a key file; default $DS_LEDGER_SIGNING_KEY)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(
            {
                "verify": _verify,
                "show": _show,
                "prove": _prove,
                "keygen": _keygen,
                "recover": _recover,
                "sign-approval": _sign_approval,
            }[args.cmd](args)
        )
    except DsError as exc:  # bad input: one line, exit 2 (exit 1 means "verification failed")
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _verify(args: argparse.Namespace) -> int:
    from ds.checkpoint._verify import load_trusted_head, verify_file
    from ds.interfaces.errors import LedgerError

    heads = []
    for spec in args.head:
        try:
            heads.append(load_trusted_head(spec))
        except FileNotFoundError as exc:  # evidence that is missing is a failed verification
            print(f"FAIL {args.path}: {exc}")
            return 1
    if args.public_key is not None:
        _check_public_key(args.public_key)
    try:
        res = verify_file(args.path, heads, args.public_key, strict=args.strict)
    except LedgerError as exc:  # e.g. a .heads line that is not a head: tampered evidence
        print(f"FAIL {args.path}: {exc}")
        return 1
    if not res.ok:
        print(f"FAIL {args.path}: first bad record {res.first_bad_index}: {res.reason}")
        return 1
    signed = (
        "signed tree heads verified"
        if res.signed
        else "tree heads are UNSIGNED (no key configured; --strict refuses this)"
    )
    print(f"OK {args.path}: {res.records} records, hash chain and Merkle tree intact, {signed}")
    if res.uncovered:
        print(
            f"WARNING {args.path}: {res.uncovered} records not covered by any "
            f"{'signed ' if res.signed else ''}tree head "
            f"(records {res.records - res.uncovered}..{res.records - 1} are only chained; anyone "
            "who can write the file could have appended them; --strict or --public-key refuses this)"
        )
    return 0


def _check_public_key(key: str) -> None:
    if len(key) != 64 or any(c not in "0123456789abcdefABCDEF" for c in key):
        raise DsError(
            f"--public-key must be 64 hex characters (an Ed25519 public key), got {key[:80]!r}; "
            "`ds ledger keygen` prints one as public_key"
        )


def _show(args: argparse.Namespace) -> int:
    from ds.checkpoint.ledger import scan

    s = scan(args.path)
    with open(args.path, "rb") as f:
        lines = f.read().split(b"\n")[: s.records]
    recs = [json.loads(line) for line in lines]
    if args.kind:
        recs = [r for r in recs if r["kind"] == args.kind]
    if args.last:
        recs = recs[-args.last :]
    for r in recs:
        if args.json:
            print(json.dumps(r, sort_keys=True))
        else:
            payload = json.dumps(r["payload"], sort_keys=True)
            if len(payload) > 100:
                payload = payload[:97] + "..."
            print(f"{r['i']:>7} rank{r['rank']:<3} {r['kind']:<20} {payload}")
    if s.reason is not None:
        print(f"WARNING: stopped at {s.reason}", file=sys.stderr)
        return 1
    return 0


def _prove(args: argparse.Namespace) -> int:
    from ds.checkpoint import merkle
    from ds.checkpoint.ledger import scan

    s = scan(args.path)
    if s.reason is not None:
        print(f"FAIL {args.path}: {s.reason}")
        return 1
    t = s.tree
    size = len(t) if args.second is None else args.second
    out: dict[str, Any]
    try:
        if args.what == "inclusion":
            proof = t.inclusion_proof(args.first, size)
            ok = merkle.verify_inclusion(
                t.leaves[args.first], args.first, size, proof, t.root(size)
            )
            out = {
                "index": args.first,
                "tree_size": size,
                "leaf_hash": t.leaves[args.first].hex(),
                "root_hash": t.root(size).hex(),
                "proof": [h.hex() for h in proof],
                "verified": ok,
            }
        else:
            proof = t.consistency_proof(args.first, size)
            ok = merkle.verify_consistency(
                args.first, size, t.root(args.first), t.root(size), proof
            )
            out = {
                "old_size": args.first,
                "new_size": size,
                "old_root": t.root(args.first).hex(),
                "new_root": t.root(size).hex(),
                "proof": [h.hex() for h in proof],
                "verified": ok,
            }
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0 if ok else 1


def _keygen(args: argparse.Namespace) -> int:
    from ds.checkpoint import signing

    key = signing.generate_key_hex()
    print(
        json.dumps(
            {
                "private_key": key,
                "public_key": signing.public_hex(signing.load_private_key(key)),
                "use": f"export {signing.ENV_KEY}=<private_key>",
            },
            indent=1,
        )
    )
    return 0


def _recover(args: argparse.Namespace) -> int:
    from ds.checkpoint._segment import recover

    evidence = recover(args.path, args.signing_key)
    if evidence is None:
        print(f"OK {args.path}: the writer accepts it as it is; nothing to recover")
    else:
        print(
            f"RECOVERED {args.path}: the refused ledger is kept as {evidence} (with its .heads, "
            ".seal and .state); a new signed segment starts with a ledger_break record describing it"
        )
    return 0


def _sign_approval(args: argparse.Namespace) -> int:
    from ds.checkpoint import merkle, signing
    from ds.checkpoint._identity import check_identity
    from ds.checkpoint.ledger import scan

    who = check_identity(args.approver, "approver")
    s = scan(args.path)
    if not 0 <= args.intent < s.records:
        raise DsError(f"ledger {args.path} has no record {args.intent} ({s.records} records)")
    with open(args.path, "rb") as f:
        line = f.read().split(b"\n")[args.intent]
    rec = json.loads(line)
    if rec["kind"] != "intent":
        raise DsError(f"ledger {args.path} record {args.intent} is a {rec['kind']}, not an intent")
    p = rec["payload"]
    message = signing.approval_bytes(
        who, args.intent, merkle.leaf_hash(line).hex(), p["operation"], p["target"]
    )
    out = {
        "intent": args.intent,
        "operation": p["operation"],
        "target": p["target"],
        "requested_by": p["actor"],
        "approver": who,
        "signature": signing.load_private_key(args.key).sign(message).hex(),
    }
    print(json.dumps(out, indent=1))
    return 0
