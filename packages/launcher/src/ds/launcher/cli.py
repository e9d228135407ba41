"""The ``ds`` console script: ``run`` and ``report`` here, other verbs discovered from plug-ins.

Verbs registered by other distributions in the ``ds.cli`` entry-point group are listed without
being imported and loaded only when invoked, so ``ds`` starts fast whatever is installed.
"""

from __future__ import annotations

import sys

BUILTIN = {
    "run": "start a job on this machine or on the hosts of a hostfile",
    "report": "print the environment: python, torch, accelerator, ds packages, kernels, comm",
}


def _plugin_verbs() -> dict[str, str]:
    from ds.interfaces import registry

    return {
        name: p.distribution or "?" for name, p in registry.list_providers(registry.CLI).items()
    }


def _usage(verbs: dict[str, str]) -> str:
    lines = ["usage: ds <command> [args...]", "", "commands:"]
    for name, text in BUILTIN.items():
        lines.append(f"  {name:<20} {text}")
    for name in sorted(verbs):
        if name in BUILTIN:
            continue
        lines.append(f"  {name.replace('.', ' '):<20} (from {verbs[name]})")
    lines += ["", "Run 'ds <command> --help' for the options of a command."]
    return "\n".join(lines)


def _version() -> str:
    from importlib.metadata import version

    return version("ds-launcher")


def _configure_logging() -> None:
    from ds.interfaces.logging import configure_cli_logging

    configure_cli_logging()


def dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage(_plugin_verbs()))
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"ds {_version()}")
        return 0
    if argv[0] == "run":
        from ds.launcher import run_cmd

        # Logging is configured by the supervisor when it first has something to log.
        return run_cmd.main(argv[1:])
    if argv[0] == "report":
        from ds.launcher import report

        return report.main(argv[1:])
    verbs = _plugin_verbs()
    for k in range(len(argv), 0, -1):
        name = ".".join(argv[:k])
        if name in verbs:
            from ds.interfaces import registry

            _configure_logging()
            fn = registry.get(registry.CLI, name)
            return int(fn(argv[k:]) or 0)
    prefix = argv[0] + "."
    subs = sorted(v.replace(".", " ") for v in verbs if v.startswith(prefix))
    if subs:
        print(f"ds {argv[0]}: choose one of: {', '.join('ds ' + s for s in subs)}", file=sys.stderr)
        return 2
    known = sorted(set(BUILTIN) | {v.replace(".", " ") for v in verbs})
    print(
        f"ds: unknown command {argv[0]!r} (available: {', '.join(known)}); see 'ds --help'",
        file=sys.stderr,
    )
    return 2


def main(argv: list[str] | None = None) -> int:
    return dispatch(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
