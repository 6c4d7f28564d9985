"""Which GPUs serve each engine target, and the GPU profile and tensor-parallel size its constants use.

NVML's processes against each target's process tree (collectors/gpu_map.py) say which GPUs are a target's;
from them come the GPUs the agent exports (`gpus: own` or `all`), the profile whose peaks its MBU and MFU
divide by (--gpu, else the NVML name's, none for a GPU without constants on file) and its TP (what the
engine says, else --tp, else its GPUs over its data-parallel ranks, else 1). Each choice is logged once,
when it or its reason changes. The sampler (sampler.py) feeds it the latest NVML sample and each target's
process tree; nothing here fetches.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable, Mapping

from rooflight.agent.config.agent import AgentConfig, TargetConfig
from rooflight.agent.roofline.gpus import DEFAULT_PROFILE_KEY, GpuMatch, GpuProfile, get_profile, match_nvml_name
from rooflight.collectors.gpu_map import GpuAssignment, assign_gpus, tensor_parallel_size
from rooflight.collectors.samples import GpuDevice, GpuSample

log = logging.getLogger("rooflight")


class TargetGpus:
    """The targets' GPUs, profiles and TPs, from the latest NVML sample (`sample`) and their process trees."""

    def __init__(self, config: AgentConfig, nvml_sampled: Callable[[], bool],
                 dp_ranks: Callable[[str], int]) -> None:
        """`nvml_sampled`: whether NVML has answered yet; `dp_ranks`: the data-parallel ranks on a target's
        latest page (by name), each a model copy on GPUs of its own."""
        self.config = config
        self.sample: GpuSample | None = None  # the latest NVML sample (None: none, or NVML failed)
        self._nvml_sampled, self._dp_ranks = nvml_sampled, dp_ranks
        self._found: dict[str, GpuAssignment] = {}  # from each target's process tree (assign)
        self._warned_default_gpu = False
        self._warned_unknown_gpus: set[str] = set()  # NVML names whose missing constants were logged
        self._tp_said: dict[str, tuple[int, str]] = {}  # target -> the (TP, rule) last logged

    def assign(self, target: TargetConfig, tree_pids: tuple[int, ...],
               processes: Mapping[str, tuple[tuple[int, int | None], ...]]) -> None:
        """The target's GPUs from its process tree's PIDs and NVML's compute processes by GPU UUID."""
        if self.sample is None:
            return
        order = [d.uuid for d in self.sample.devices]
        self._found[target.name] = assign_gpus(tree_pids, processes, order)

    def gpus_of(self, target: TargetConfig) -> GpuAssignment | None:
        """The target's GPUs among those NVML shows now, and the rule that found them: its process tree's
        (gpu_map.assign_gpus), else every GPU seen ("all_visible"); None while NVML shows none."""
        if self.sample is None or not self.sample.devices:
            return None
        order = tuple(d.uuid for d in self.sample.devices)
        found = self._found.get(target.name)
        if found is None:
            return GpuAssignment(order, "all_visible")
        return GpuAssignment(tuple(u for u in found.uuids if u in order), found.source)

    def exported(self, target_gpus: dict[str, GpuAssignment]) -> GpuSample | None:
        """The GPUs this agent exports: its targets' own (`gpus: own`), or every one NVML shows (`gpus: all`),
        so eight sidecars on an eight-GPU node export eight GPU series between them, not 64."""
        if self.sample is None or self.config.gpus == "all":
            return self.sample
        own = {uuid for assignment in target_gpus.values() for uuid in assignment.uuids}
        return replace(self.sample, devices=tuple(d for d in self.sample.devices if d.uuid in own))

    def own_devices(self, target: TargetConfig) -> list[GpuDevice]:
        """The NVML devices serving this target: matched by process, else every GPU when it is the only target."""
        devices = list(self.sample.devices) if self.sample else []
        assignment = self._found.get(target.name)
        if assignment is not None and (assignment.source != "all_visible" or len(self.config.targets) == 1):
            return [d for d in devices if d.uuid in assignment.uuids]
        return devices if len(self.config.targets) == 1 else devices[:1]

    def tp_for(self, target: TargetConfig, engine_tp: float | None) -> int:
        """The target's TP, logged when it or its rule changes (see _tp_and_rule)."""
        tp, rule = self._tp_and_rule(target, engine_tp)
        if self._tp_said.get(target.name) != (tp, rule):
            self._tp_said[target.name] = (tp, rule)
            level = logging.WARNING if target.tp and tp != target.tp else logging.INFO
            log.log(level, "target %s: tensor-parallel size %d (%s)", target.name, tp, rule)
        return tp

    def _tp_and_rule(self, target: TargetConfig, engine_tp: float | None) -> tuple[int, str]:
        """What the engine says (its info endpoint, else its page: TRT-LLM parallel_config_info, SGLang
        tp_rank); else --tp; else the GPUs NVML shows the engine's own processes on divided by the
        data-parallel ranks on its page (vLLM `engine`, SGLang `dp_rank`); else 1. Each with its rule."""
        if engine_tp:
            overrides = f", over --tp {target.tp}" if target.tp and target.tp != int(engine_tp) else ""
            return int(engine_tp), f"the engine says so{overrides}"
        if target.tp:
            return target.tp, "--tp"
        assignment = self._found.get(target.name)
        if assignment is None or assignment.source != "nvml_pids" or not assignment.uuids:
            return 1, "nothing says otherwise"
        gpus, ranks = len(assignment.uuids), self._dp_ranks(target.name)
        tp = tensor_parallel_size(gpus, data_parallel=ranks)
        if tp is None:
            return 1, f"{gpus} GPUs under the engine do not divide into its {ranks} data-parallel ranks; pass --tp"
        return tp, f"{gpus} GPUs under the engine / {ranks} data-parallel rank{'s' if ranks > 1 else ''}"

    def profile_for(self, target: TargetConfig) -> tuple[GpuProfile | None, str, str]:
        """(profile, how it was chosen, why there is none): --gpu; else the NVML name of the target's GPUs,
        where a name with no constants on file gives no profile (MBU/MFU absent, never another GPU's
        peaks); else, with no GPU seen, the default profile."""
        if target.gpu:
            return get_profile(target.gpu), "flag", ""
        unknown: GpuMatch | None = None
        for device in self.own_devices(target):
            match = match_nvml_name(device.name, device.memory_total_bytes)
            if match.profile is not None:
                return match.profile, "nvml", ""
            unknown = unknown or match
        if unknown is not None:
            if unknown.name not in self._warned_unknown_gpus:
                self._warned_unknown_gpus.add(unknown.name)
                log.warning("target %s: GPU %r has no constants on file: %s", target.name, unknown.name, unknown.reason)
            return None, "nvml", unknown.reason
        if self.config.nvml and not self._nvml_sampled():
            return get_profile(DEFAULT_PROFILE_KEY), "default", ""  # NVML has not answered yet: no verdict
        if not self._warned_default_gpu:
            log.warning("no GPU detected and no --gpu given: using the %s profile's peaks", DEFAULT_PROFILE_KEY)
            self._warned_default_gpu = True
        return get_profile(DEFAULT_PROFILE_KEY), "default", ""


def gpu_profiles(sample: GpuSample | None) -> tuple[dict[int, str], dict[int, str]]:
    """Per NVML index: the profile its name matches ("unknown" for none), and why it has none."""
    profiles, notes = {}, {}
    for device in sample.devices if sample else ():
        match = match_nvml_name(device.name, device.memory_total_bytes)
        profiles[device.index] = match.key
        if match.reason:
            notes[device.index] = match.reason
    return profiles, notes
