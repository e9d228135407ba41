import pytest

from ds.interfaces import errors
from ds.interfaces.checkpoint import LoadRequest, TensorMeta
from ds.interfaces.ledger import Assessment, Finding
from ds.interfaces.runner import LaunchSpec
from ds.interfaces.telemetry import EventBus, StepMetrics


def test_every_error_is_a_dserror():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.DsError)


def test_errors_keep_builtin_bases_for_existing_handlers():
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.CollectiveTimeoutError, TimeoutError)
    assert issubclass(errors.AsyncIOError, OSError)


def test_eventbus_filters_by_type_and_isolates_failures():
    bus = EventBus()
    seen: list[object] = []
    bus.subscribe(seen.append, StepMetrics)

    def boom(_event: object) -> None:
        raise RuntimeError("subscriber bug")

    bus.subscribe(boom)
    m = StepMetrics(step=1, loss=1.0, lr=1e-3, step_time_s=0.1)
    bus.publish(m)
    bus.publish("not a step")
    assert seen == [m]
    assert len(bus.errors) == 2
    bus.unsubscribe(boom)
    bus.publish(m)
    assert len(bus.errors) == 2


def test_small_dataclasses():
    meta = TensorMeta("w", (3, 4), "float32")
    assert meta.numel == 12
    with pytest.raises(AttributeError):
        meta.name = "x"  # type: ignore[misc]
    assert LoadRequest("w", 2, 5).numel == 5
    spec = LaunchSpec(
        hosts={"a": [0, 1], "b": [0]}, master_addr="a", master_port=1, user_command=["x"]
    )
    assert spec.world_size == 3
    crit = Finding("ddi", 20.0, 12.0, "critical", "too much debt")
    assert not Assessment(10.0, [crit]).passed
    assert Assessment(99.0).passed
