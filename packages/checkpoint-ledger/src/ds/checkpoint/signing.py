"""Ed25519 signatures over ledger tree heads.

The signing key comes from the ledger's configuration or from ``DS_LEDGER_SIGNING_KEY``: either 64
hex characters (the raw 32-byte private key) or a path to a PEM/raw key file. Without a key, heads
are unsigned and every report says so.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ds.interfaces.errors import ConfigError
from ds.interfaces.ledger import TreeHead

ENV_KEY = "DS_LEDGER_SIGNING_KEY"
_DOMAIN = b"ds-ledger-tree-head-v1\n"


def head_bytes(size: int, root_hash: str, timestamp: float) -> bytes:
    """The exact bytes a tree head signature covers."""
    body = json.dumps(
        {"root_hash": root_hash, "size": size, "timestamp": timestamp},
        sort_keys=True,
        separators=(",", ":"),
    )
    return _DOMAIN + body.encode()


def load_private_key(spec: Any) -> Any:
    """An Ed25519PrivateKey from a key object, 32 raw bytes, 64 hex chars or a key file path."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if spec is None or isinstance(spec, Ed25519PrivateKey):
        return spec
    if isinstance(spec, bytes) and len(spec) == 32:
        return Ed25519PrivateKey.from_private_bytes(spec)
    if isinstance(spec, str):
        s = spec.strip()
        if len(s) == 64 and all(c in "0123456789abcdefABCDEF" for c in s):
            return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(s))
        if os.path.exists(s):
            with open(s, "rb") as f:
                data = f.read()
            if len(data) == 32:
                return Ed25519PrivateKey.from_private_bytes(data)
            try:
                key = serialization.load_pem_private_key(data, password=None)
            except ValueError as exc:
                raise ConfigError(
                    f"ledger signing key file {s} is not a PEM or raw 32-byte Ed25519 key: {exc}"
                ) from exc
            if not isinstance(key, Ed25519PrivateKey):
                raise ConfigError(f"ledger signing key {s} is not an Ed25519 key")
            return key
    raise ConfigError(
        "ledger signing key must be 64 hex characters (raw Ed25519 private key) or a path to a "
        f"PEM/raw key file (from config ledger.signing_key or ${ENV_KEY}); got {type(spec).__name__}"
    )


def key_from_env() -> Any:
    spec = os.environ.get(ENV_KEY)
    return load_private_key(spec) if spec else None


def public_hex(private_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return bytes(raw).hex()


def sign_head(private_key: Any | None, size: int, root_hash: str, timestamp: float) -> TreeHead:
    if private_key is None:
        return TreeHead(size, root_hash, timestamp)
    sig = private_key.sign(head_bytes(size, root_hash, timestamp)).hex()
    return TreeHead(size, root_hash, timestamp, sig, public_hex(private_key))


def verify_head_signature(head: TreeHead, trusted_public_key: str | None = None) -> bool:
    """True when ``head`` carries a valid signature (by ``trusted_public_key`` when given)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if head.signature is None or head.public_key is None:
        return False
    if trusted_public_key is not None and head.public_key.lower() != trusted_public_key.lower():
        return False
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(head.public_key))
        key.verify(
            bytes.fromhex(head.signature), head_bytes(head.size, head.root_hash, head.timestamp)
        )
    except (InvalidSignature, ValueError):
        return False
    return True


def generate_key_hex() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    raw = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return raw.hex()


_ROTATION_DOMAIN = b"ds-ledger-key-rotation-v1\n"


def rotation_bytes(index: int, old_public: str, new_public: str) -> bytes:
    """The bytes a key-rotation record's signature covers: where it stands, and both keys."""
    body = json.dumps(
        {
            "index": index,
            "new_public_key": new_public.lower(),
            "old_public_key": old_public.lower(),
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return _ROTATION_DOMAIN + body.encode()


def sign_rotation(old_private: Any, index: int, new_public: str) -> str:
    return str(old_private.sign(rotation_bytes(index, public_hex(old_private), new_public)).hex())


def verify_rotation(index: int, old_public: str, new_public: str, signature: str) -> bool:
    """True when ``signature`` is ``old_public``'s approval of ``new_public`` at record ``index``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(old_public))
        key.verify(bytes.fromhex(signature), rotation_bytes(index, old_public, new_public))
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


_SEAL_DOMAIN = b"ds-ledger-writer-seal-v1"


def seal_key(private_key: Any) -> bytes:
    """The writer's MAC key for its seal (``_seal``), derived from the signing key: only a holder
    of the signing key can make or check a seal."""
    import hashlib
    import hmac

    from cryptography.hazmat.primitives import serialization

    raw = private_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return hmac.digest(raw, _SEAL_DOMAIN, hashlib.sha256)


_APPROVAL_DOMAIN = b"ds-ledger-approval-v1\n"


def approval_bytes(
    approver: str, intent: int, intent_leaf: str, operation: str, target: str
) -> bytes:
    """What an approver signs: who approves which intent (its index and Merkle leaf hash, which
    fix the one record in one ledger), for which operation and target."""
    body = json.dumps(
        {
            "approver": approver,
            "intent": intent,
            "intent_leaf": intent_leaf,
            "operation": operation,
            "target": target,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return _APPROVAL_DOMAIN + body.encode()


def verify_signature(public_hex_key: str, signature: str, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex_key))
        key.verify(bytes.fromhex(signature), message)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def check_public_hex(key: str, what: str) -> str:
    """``key`` as lower-case hex when it is an Ed25519 public key; ConfigError naming ``what``."""
    k = str(key).strip().lower()
    if len(k) != 64 or any(c not in "0123456789abcdef" for c in k):
        raise ConfigError(
            f"{what} must be 64 hex characters (an Ed25519 public key; `ds ledger keygen` prints "
            f"one as public_key), got {str(key)[:80]!r}"
        )
    return k
