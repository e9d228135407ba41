"""Who is who in an approval: identities compared by a skeleton, look-alike names refused.

``identity_key(name)`` is the form two names are compared in: Unicode NFKC (full-width and
compatibility forms fold), combining marks removed (``alicé``, ``alice`` + U+0301 and ``alİce``
are ``alice``), common Cyrillic and Greek look-alikes mapped to the Latin letter they imitate,
trimmed and case-folded. ``check_identity(name, role)`` refuses, before anything is recorded, a name
that hides characters (format and control characters such as U+200B ZERO WIDTH SPACE or U+00AD
SOFT HYPHEN) or mixes the letters of two scripts (``alice`` with a Cyrillic U+0430 for its ``a``), so a name that
looks like someone else's is never accepted as a different person.
"""

from __future__ import annotations

import unicodedata

from ds.interfaces.errors import ApprovalRequiredError

# Cyrillic and Greek letters that render like a Latin one (after case folding).
_LOOKALIKES = str.maketrans(
    "\u0430\u0435\u04bb\u0456\u0458\u043a\u04cf\u043e\u0440\u0441\u0443\u0445\u0455\u0501\u051b"
    "\u051d\u04af\u03b1\u03b2\u03b5\u03b7\u03b9\u03ba\u03bd\u03bf\u03c1\u03c4\u03c5\u03c7\u03f2",
    "aehijklopcyxsdqwyabenikvoptuxc",
)
# Scripts written together in one name (Japanese, Korean, Chinese).
_HAN = {"CJK", "HIRAGANA", "KATAKANA", "HANGUL", "KATAKANA-HIRAGANA"}


def identity_key(name: str) -> str:
    """The skeleton two identities are compared by (see the module docstring)."""
    decomposed = unicodedata.normalize("NFKD", str(name))
    bare = "".join(c for c in decomposed if not unicodedata.combining(c))
    return unicodedata.normalize("NFKC", bare).strip().casefold().translate(_LOOKALIKES)


def _script(c: str) -> str:
    word = unicodedata.name(c, "UNKNOWN").split(" ")[0]
    return "CJK" if word in _HAN else word


def check_identity(name: str, role: str) -> str:
    """``name``'s identity key; ApprovalRequiredError (one line) for a look-alike or empty name."""
    text = unicodedata.normalize("NFKC", str(name)).strip()
    for c in text:
        cat = unicodedata.category(c)
        if cat[0] == "C" or cat in ("Zl", "Zp") or (cat == "Zs" and c != " "):
            code = f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}"
            raise ApprovalRequiredError(
                f"{role} name {name!r} contains the invisible character {code}; write the name "
                "without it"
            )
    scripts = {_script(c) for c in text if unicodedata.category(c).startswith("L")}
    if len(scripts) > 1:
        raise ApprovalRequiredError(
            f"{role} name {name!r} mixes letters of {' and '.join(sorted(scripts))} (a look-alike "
            "of another name); write it in one script"
        )
    key = identity_key(text)
    if not key:
        raise ApprovalRequiredError(f"{role} name {name!r} is empty; name a person")
    return key
