"""ds.zero: The ds training engine: config, ZeRO stages 0-3, offload, precision."""


def __getattr__(name: str) -> object:
    # ZeRO-3 construction helpers, imported on first use so `import ds.zero` stays light.
    if name in ("Init", "GatheredParameters", "register_external_parameter"):
        if name == "register_external_parameter":
            from ds.zero.stage3.partitioner import register_external_parameter

            return register_external_parameter
        from ds.zero import init

        return getattr(init, name)
    raise AttributeError(f"module 'ds.zero' has no attribute {name!r}")
