"""The profile as text: a summary, the top modules at each depth, and the module tree."""

from __future__ import annotations

from ds.monitor.flops.profiler import FlopsProfiler, ModuleStats, number_to_string


def _line(s: ModuleStats, total_macs: int, total_s: float, passes: int) -> str:
    share = 100.0 * s.macs / total_macs if total_macs else 0.0
    per = max(passes, 1)
    latency = s.latency_s / per
    flops_s = s.flops / per / latency if latency > 0 else 0.0
    return (
        f"{s.name or '(root)'} ({s.type_name}): {number_to_string(s.params, 'params')}, "
        f"{number_to_string(s.macs / per, 'MACs')} ({share:.2f}%), "
        f"{latency * 1e3:.3f} ms, {number_to_string(flops_s, 'FLOPS')}"
    )


def format_profile(
    prof: FlopsProfiler,
    *,
    profile_step: int | None = None,
    module_depth: int = -1,
    top_modules: int = 1,
    detailed: bool = True,
    peak_flops: float | None = None,
) -> str:
    root = prof.root
    passes = max(prof.forward_passes, 1)
    fwd_macs = root.macs / passes
    fwd_flops = root.flops / passes
    fwd_s = root.latency_s / passes
    train_flops = prof.training_flops() / passes
    out = ["-" * 26 + " ds flops profiler " + "-" * 26]
    if profile_step is not None:
        out.append(f"profile step:                 {profile_step}")
    out += [
        f"forward passes profiled:      {prof.forward_passes}",
        f"params per device:            {number_to_string(root.params, '')}",
        f"fwd MACs per device:          {number_to_string(fwd_macs, 'MACs')}",
        f"fwd FLOPs per device:         {number_to_string(fwd_flops, 'FLOPs')}",
        f"fwd+bwd FLOPs per device:     {number_to_string(train_flops, 'FLOPs')}"
        f" (bwd = 2 x fwd; recompute factor {prof.recompute_fwd_factor:g})",
        f"fwd latency:                  {fwd_s * 1e3:.3f} ms",
    ]
    fwd_rate = fwd_flops / fwd_s if fwd_s > 0 else 0.0
    out.append(f"fwd FLOPS per device:         {number_to_string(fwd_rate, 'FLOPS')}")
    if peak_flops:
        out.append(f"fwd MFU:                      {100.0 * fwd_rate / peak_flops:.2f}%")
    else:
        out.append("fwd MFU:                      n/a (device peak unknown; set DS_PEAK_TFLOPS)")
    depths = sorted({s.depth for s in prof.stats.values()})
    if module_depth >= 0:
        depths = [d for d in depths if d <= module_depth]
    out.append("")
    out.append(f"top {top_modules} module(s) by MACs at each depth:")
    for d in depths:
        tops = prof.top_modules(d, top_modules)
        names = ", ".join(
            f"{s.name or '(root)'} ({s.type_name}) {number_to_string(s.macs / passes, 'MACs')}"
            for s in tops
        )
        out.append(f"  depth {d}: {names}")
    if detailed:
        out.append("")
        out.append("per module (params, MACs and share of the total, latency, FLOPS):")

        def walk(name: str) -> None:
            s = prof.stats[name]
            if module_depth >= 0 and s.depth > module_depth:
                return
            out.append("  " * s.depth + _line(s, root.macs, root.latency_s, passes))
            for child in s.children:
                walk(child)

        walk("")
    out.append("-" * 71)
    return "\n".join(out)
