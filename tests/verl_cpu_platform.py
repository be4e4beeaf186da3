"""A CPU platform for verl 0.9.1, registered through verl's own PlatformRegistry (tests only).

verl 0.9.1 registers no CPU platform (nvidia/huawei/amd only; without a GPU it falls back to
'nvidia' and asks for NCCL). Importing this module registers one named ``cpu``; select it with
``VERL_PLATFORM=cpu`` (and ``VERL_ENGINE_DEVICE=cuda`` to pick the FSDP engine class). Ray
workers get it through verl's ``VERL_USE_EXTERNAL_MODULES=verl_cpu_platform`` (imported inside
``import verl``), with this folder on their ``PYTHONPATH``. Not part of the package.
"""

from __future__ import annotations

import torch


def register() -> None:
    """Register the ``cpu`` platform in verl's PlatformRegistry (idempotent)."""
    import contextlib
    import types

    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    module = types.SimpleNamespace(
        is_available=lambda: True,
        current_device=lambda: "cpu",
        device_count=lambda: 1,
        set_device=lambda *a: None,
        synchronize=lambda *a, **k: None,
        empty_cache=lambda: None,
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        max_memory_allocated=lambda *a, **k: 0,
        max_memory_reserved=lambda *a, **k: 0,
        memory_allocated=lambda *a, **k: 0,
        memory_reserved=lambda *a, **k: 0,
        reset_peak_memory_stats=lambda *a, **k: None,
        mem_get_info=lambda *a, **k: (0, 0),
        get_device_name=lambda *a, **k: "CPU",
        get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state,
    )

    @PlatformRegistry.register("cpu")
    class PlatformCPU(PlatformBase):
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: module)

        def is_available(self):
            return True

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, device_index):
            return None

        def synchronize(self, device_index=None):
            return None

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings):
            return None

        def empty_cache(self):
            return None

        def get_device_capability(self, device_index=0):
            return (None, None)

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "CPU_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg):
            yield

        def profiler_start(self):
            return None

        def profiler_stop(self):
            return None

        def ray_resource_name(self):
            return "CPU"

        def ray_noset_envvars(self):
            return []

        def is_ipc_supported(self):
            return False

        def cudart(self):
            return None


def _gloo_only() -> None:
    """verl's ``initialize_global_process_group_ray`` asks for ``cpu:gloo,<device>:<backend>``,
    which torch refuses when the device is the CPU too (``Duplicate device type cpu``): pass
    plain ``gloo`` for that one string (idempotent)."""
    import torch.distributed as dist

    init = dist.init_process_group
    if getattr(init, "_lld_cpu", False):
        return

    def init_process_group(backend=None, *args, **kwargs):
        if backend == "cpu:gloo,cpu:gloo":
            backend = "gloo"
        return init(backend, *args, **kwargs)

    init_process_group._lld_cpu = True
    dist.init_process_group = init_process_group


register()
_gloo_only()
