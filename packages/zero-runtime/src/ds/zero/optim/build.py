"""Building the optimizer a ZeRO stage steps: from the config, a client instance or a callable."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from ds.interfaces.errors import ConfigError, ProviderNotFoundError
from ds.interfaces.kernels import KernelProvider
from ds.zero.config.sections import OptimizerConfig
from ds.zero.optim import flat
from ds.zero.optim.lion import Lion
from ds.zero.optim.muon import Muon, muon_param_groups
from ds.zero.optim.none import NoOptimizer
from ds.zero.optim.options import adam_is_decoupled, config_params, refuse_client_options

ClientOptimizer = torch.optim.Optimizer | Callable[[Any], torch.optim.Optimizer]

_HYPER_KEYS = (
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "momentum",
    "dampening",
    "nesterov",
    "lr_decay",
    "initial_accumulator_value",
    "amsgrad",
)


def refuse_non_host_optimizer(client: torch.optim.Optimizer) -> None:
    """Raise unless ``client`` is one of ds.ops' host-kernel optimizers (CPUAdam, CPUAdagrad,
    CPULion: they declare ``host_kernels``)."""
    if getattr(type(client), "host_kernels", False):
        return
    raise ConfigError(
        f"zero_optimization.offload_optimizer steps a client optimizer on the host, and "
        f"{type(client).__name__} is not one of ds's host-kernel optimizers; pass "
        "ds.ops.optim.CPUAdam / CPULion / CPUAdagrad (deepspeed.ops.adam.DeepSpeedCPUAdam), or "
        "configure the optimizer in the config's optimizer section, or set "
        '"zero_force_ds_cpu_optimizer": false to have ds run it anyway'
    )


class UntestedOptimizerError(ConfigError, AssertionError):
    """A client optimizer ZeRO is not tested with, without ``zero_allow_untested_optimizer`` (an
    AssertionError in DeepSpeed, so it is one here too)."""


def refuse_untested_optimizer(client: torch.optim.Optimizer) -> None:
    """Raise unless ``client`` is torch's Adam, AdamW or Adagrad (or a subclass) or one of ds's
    own optimizers: the ones ZeRO's sharded steps are tested with."""
    tested = (torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad)
    if isinstance(client, tested) or type(client).__module__.split(".")[0] == "ds":
        return
    raise UntestedOptimizerError(
        f"ZeRO is not tested with the client optimizer {type(client).__name__}; set "
        '"zero_allow_untested_optimizer": true in the config to use it anyway, or use Adam, '
        "AdamW, Adagrad or one of ds's optimizers"
    )


class OptimizerFactory:
    """Given the stage's parameter groups (its flat fp32 tensors), returns the optimizer."""

    def __init__(
        self,
        config: OptimizerConfig | None,
        client: ClientOptimizer | None,
        offload: bool,
        kernels: KernelProvider | None,
        *,
        force_host_optimizer: bool = False,
        allow_untested: bool = True,
    ) -> None:
        if config is not None and client is not None:
            # DeepSpeed steps the client's optimizer and ignores the section; say so.
            warnings.warn(
                f"config.optimizer ({config.type}) is ignored: initialize() was also given an "
                "optimizer, which is the one stepped; remove one of them to silence this",
                UserWarning,
                stacklevel=3,
            )
            config = None
        if offload and kernels is None and (config is not None or client is not None):
            raise ProviderNotFoundError(
                "zero_optimization.offload_optimizer.device='cpu' steps the optimizer with the CPU "
                "kernels of ds-ops-kernels, and no kernel provider 'cpu' is registered; install it "
                "(pip install ds-ops-kernels)"
            )
        if offload and client is not None and not isinstance(client, torch.optim.Optimizer):
            raise ConfigError("offload_optimizer needs a config optimizer or a torch optimizer")
        # DeepSpeed's zero_force_ds_cpu_optimizer (on unless set false): under offload a client
        # optimizer must be one of the host-kernel optimizers, so that nobody steps a slow
        # Python optimizer on the host by accident.
        if force_host_optimizer and offload and isinstance(client, torch.optim.Optimizer):
            refuse_non_host_optimizer(client)
        # DeepSpeed's zero_allow_untested_optimizer (off by default): at ZeRO stages 1-3 a client
        # optimizer outside the tested set is refused; a callable's is checked once built.
        self.allow_untested = allow_untested
        if not allow_untested and isinstance(client, torch.optim.Optimizer):
            refuse_untested_optimizer(client)
        self.config = config
        self.client = client
        self.offload = offload
        self.kernels = kernels

    @property
    def present(self) -> bool:
        """Whether there is an optimizer at all. Without one (no section, none passed) the
        engine only runs the model forward, as DeepSpeed's does for evaluation and inference."""
        return self.config is not None or self.client is not None

    def initial_groups(
        self, module_groups: list[dict[str, Any]], names: dict[int, str] | None = None
    ) -> list[dict[str, Any]]:
        """The user's parameter groups with hyper-parameters (what a stage will flatten). None
        without an optimizer: nothing is trained, so no stage holds master weights or gradient
        buffers for it. Muon splits each group into its Muon and AdamW halves (``names``, the
        parameters' module names, pick out embeddings and output heads)."""
        if not self.present:
            return []
        client = self.client
        if isinstance(client, torch.optim.Optimizer):
            return [dict(g) for g in client.param_groups]
        if client is None and self.config is not None and self.config.type == "muon":
            return muon_param_groups(module_groups, dict(self.config.params), names or {})
        return module_groups

    def __call__(self, groups: list[dict[str, Any]]) -> Any:
        """The optimizer over ``groups`` (a :class:`NoOptimizer` when there is none)."""
        if not self.present:
            return NoOptimizer()
        client = self.client
        if isinstance(client, torch.optim.Optimizer):
            if self.offload:
                return self._offload_from_client(client, groups)
            # Re-point the client's groups at the stage's tensors, keeping hyper-parameters and the
            # object itself, so client LR schedulers built on it keep working.
            client.state.clear()
            client.param_groups.clear()
            for g in groups:
                client.add_param_group(g)
            return client
        if client is not None:
            built = client(groups)
            if not self.allow_untested:
                refuse_untested_optimizer(built)
            return built
        assert self.config is not None
        return self._from_config(self.config, groups)

    def _steps_on_device(self, groups: list[dict[str, Any]]) -> bool:
        """Whether the kernel provider serves the accelerator the groups live on (the ``cuda``
        provider's one fused launch per flat buffer), rather than the per-chunk Python loop of
        the flat optimizers. Host tensors without offload keep the flat optimizers."""
        if self.kernels is None:
            return False
        served = set(self.kernels.devices())
        kinds = {p.device.type for g in groups for p in g["params"]}
        return bool(kinds) and "cpu" not in kinds and kinds <= served

    def _from_config(
        self, cfg: OptimizerConfig, groups: list[dict[str, Any]]
    ) -> torch.optim.Optimizer:
        kind = cfg.type
        params = config_params(kind, dict(cfg.params))
        # DeepSpeed's switch between Adam with L2 decay (False) and AdamW (True, the default);
        # type "AdamW" is always decoupled, the key still accepted.
        adam_w_mode = bool(params.pop("adam_w_mode", True))
        adamw_mode = kind == "adamw" or adam_w_mode
        bias_correction = bool(params.pop("bias_correction", True))
        if kind == "muon":
            # The halves' settings were put in the groups by initial_groups.
            return Muon(groups, adamw_mode=adam_w_mode)
        if self.offload or (
            kind in ("adam", "adamw", "adagrad", "lion") and self._steps_on_device(groups)
        ):
            from ds.zero.optim.provider import ProviderAdagrad, ProviderAdam, ProviderLion

            assert self.kernels is not None
            if kind in ("adam", "adamw"):
                return ProviderAdam(
                    groups,
                    self.kernels,
                    adamw_mode=adamw_mode,
                    bias_correction=bias_correction,
                    **params,
                )
            if kind == "adagrad":
                return ProviderAdagrad(groups, self.kernels, **params)
            if kind == "lion":
                return ProviderLion(groups, self.kernels, **params)
            raise ConfigError(f"offload_optimizer does not support optimizer {kind!r}")
        if kind in ("adam", "adamw"):
            return flat.Adam(
                groups,
                adamw_mode=adamw_mode,
                bias_correction=bias_correction,
                fused=not bool(cfg.params.get("torch_adam", False)),
                **params,
            )
        if kind == "adagrad":
            return flat.Adagrad(groups, **params)
        if kind == "sgd":
            return flat.SGD(groups, **params)
        if kind == "lion":
            return Lion(groups, **params)
        raise ConfigError(f"unknown optimizer type {kind!r}")

    def _offload_from_client(
        self, client: torch.optim.Optimizer, groups: list[dict[str, Any]]
    ) -> torch.optim.Optimizer:
        from ds.zero.optim.provider import ProviderAdagrad, ProviderAdam

        assert self.kernels is not None
        refuse_client_options(client)
        hyper = {k: v for k, v in client.defaults.items() if k in _HYPER_KEYS}
        hyper.pop("amsgrad", None)  # False: refuse_client_options refused True
        # DeepSpeed's CPU optimizers (DeepSpeedCPUAdam/DeepSpeedCPUAdagrad, ds.ops' CPUAdam and
        # CPUAdagrad), which accelerate puts in place of a Trainer's AdamW or Adagrad under
        # offload, name their mode in their defaults and run on the same host kernels.
        name = type(client).__name__.lower()
        cpu_adam = "adam" in name and "adamw_mode" in client.defaults
        if isinstance(client, torch.optim.AdamW | torch.optim.Adam) or cpu_adam:
            adamw = bool(client.defaults["adamw_mode"]) if cpu_adam else adam_is_decoupled(client)
            bias = bool(client.defaults.get("bias_correction", True))
            return ProviderAdam(
                groups, self.kernels, adamw_mode=adamw, bias_correction=bias, **hyper
            )
        if isinstance(client, torch.optim.Adagrad) or (
            name.endswith("adagrad") and "lr_decay" in client.defaults
        ):
            return ProviderAdagrad(groups, self.kernels, **hyper)
        raise ConfigError(
            f"offload_optimizer cannot run a client {type(client).__name__} on the host kernels; "
            "use Adam, AdamW or Adagrad, or configure the optimizer in the config"
        )
