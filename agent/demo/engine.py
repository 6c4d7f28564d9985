"""The simulated engine: a pure, deterministic step simulator of vLLM-style continuous batching.

Each step, at simulated time `now`: running sequences are scheduled oldest first (one decode token
each, or their next prefill chunk); a sequence that needs a KV block when the pool is empty preempts
the newest running sequence (recompute: its blocks are freed and it re-queues at the front, to be
prefilled again over prompt + generated tokens). If nothing was preempted, waiting requests are
admitted FIFO while the batch is under max_num_seqs, the token budget allows and their blocks
(block size 16) are free. Without chunked prefill a prompt is prefilled whole in one step. The step's
duration comes from `plant.step_seconds`; its effects (tokens, latencies, counters) land when it
completes, as vLLM reports them. Nothing here reads a clock: `advance_to(t)` runs every step that
starts before `t`, so the result does not depend on how often it is called.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from rooflight.agent.demo import plant as costs
from rooflight.agent.demo.config import DemoConfig
from rooflight.agent.demo.plant import Plant
from rooflight.agent.roofline.step import StepCost
from rooflight.agent.demo.scenarios import Arrival, ArrivalStream, Workload
from rooflight.agent.demo.tally import Tally


@dataclass(slots=True, eq=False)
class Request:
    arrival: float
    prompt_tokens: int
    max_tokens: int
    injected: bool = False
    prefill_target: int = 0  # tokens to prefill on (re)admission: prompt, or prompt + generated after preemption
    computed: int = 0  # tokens with KV in the cache
    generated: int = 0
    blocks: int = 0
    preemptions: int = 0
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float = 0.0
    aborted: bool = False

    @property
    def decoding(self) -> bool:
        return self.computed >= self.prefill_target


@dataclass(slots=True)
class StepPlan:
    """One committed step: who runs what, from `start` to `end`."""

    start: float
    end: float
    prefill: list[tuple[Request, int]] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)
    live_kv_tokens: int = 0
    cost: StepCost | None = None  # what the step model says the step reads and computes


class Simulator:
    """Continuous batching over a paged KV pool, in simulated seconds."""

    def __init__(self, config: DemoConfig, plant: Plant, workload: Workload) -> None:
        self.config = config
        self.plant = plant
        self.max_num_seqs = config.max_num_seqs or workload.max_num_seqs
        self.budget = config.batched_tokens_budget()
        self.usable_blocks = plant.num_gpu_blocks - 1  # vLLM keeps one null block
        self.free_blocks = self.usable_blocks
        self.now = 0.0
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.tally = Tally(config.max_model_len)
        self.inflight: StepPlan | None = None
        self.last_step: StepPlan | None = None
        self._stream = ArrivalStream(workload, config.seed, config.max_model_len)
        self._injected: list[Arrival] = []  # sorted by time

    # -- arrivals ---------------------------------------------------------------------------------
    def add_arrivals(self, arrivals: list[Arrival]) -> None:
        """Queue extra requests (injected events); they join when simulated time reaches them."""
        self._injected.extend(arrivals)
        self._injected.sort(key=lambda a: a.time)

    def _next_arrival_time(self) -> float:
        return min(self._stream.peek(), self._injected[0].time if self._injected else math.inf)

    def _enqueue_due(self) -> None:
        while self._next_arrival_time() <= self.now:
            if self._injected and self._injected[0].time <= self._stream.peek():
                a = self._injected.pop(0)
            else:
                a = self._stream.pop()
            if len(self.waiting) >= self.config.max_num_queued_reqs:
                self.tally.admission_rejections += 1
                continue
            self.waiting.append(Request(a.time, a.prompt_tokens, a.output_tokens, a.injected, a.prompt_tokens))

    # -- the clockless driver ---------------------------------------------------------------------
    def advance_to(self, t: float) -> None:
        """Run every step that starts before `t`; a step still running at `t` completes later."""
        while True:
            if self.inflight is not None:
                if self.inflight.end > t:
                    return
                self._complete(self.inflight)
                self.now = self.inflight.end
                self.inflight = None
            self._enqueue_due()
            plan = self._plan()
            if plan is not None:
                self.inflight = plan
                continue
            nxt = self._next_arrival_time()
            if nxt > t:
                self.now = max(self.now, t)
                return
            self.now = max(self.now, nxt)

    # -- scheduling -------------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.plant.block_size)

    def _preempt_newest(self) -> Request:
        victim = self.running.pop()
        self.free_blocks += victim.blocks
        victim.blocks = 0
        victim.computed = 0
        victim.prefill_target = victim.prompt_tokens + victim.generated
        victim.preemptions += 1
        self.tally.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _plan(self) -> StepPlan | None:
        budget = self.budget
        plan = StepPlan(self.now, self.now)
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            need = 1 if req.decoding else min(req.prefill_target - req.computed, budget)
            extra = self._blocks_for(req.computed + need) - req.blocks
            victim = None
            while extra > self.free_blocks and victim is not req:
                preempted = True
                victim = self._preempt_newest()
            if victim is req:
                break  # it was the newest itself: nothing left to schedule after it
            self.free_blocks -= extra
            req.blocks += extra
            if req.decoding:
                plan.decode.append(req)
                plan.live_kv_tokens += req.computed
            else:
                plan.prefill.append((req, need))
            budget -= need
            i += 1
        if not preempted:
            budget = self._admit(plan, budget)
        if not plan.decode and not plan.prefill:
            return None
        step = costs.step_of(self.plant, [(r.computed, r.computed + n, r.computed + n >= r.prefill_target)
                                          for r, n in plan.prefill], [r.computed for r in plan.decode])
        plan.cost = costs.step_cost(self.plant, step)
        plan.end = self.now + costs.step_seconds(self.plant, step)
        return plan

    def _admit(self, plan: StepPlan, budget: int) -> int:
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            req = self.waiting[0]
            todo = req.prefill_target
            n = min(todo, budget) if self.config.chunked_prefill else todo
            blocks = self._blocks_for(n)
            if n > budget or blocks > self.free_blocks:
                break
            self.waiting.popleft()
            self.free_blocks -= blocks
            req.blocks = blocks
            if req.first_scheduled is None:
                req.first_scheduled = self.now
                self.tally.prefix_cache_queries += req.prompt_tokens
            self.running.append(req)
            plan.prefill.append((req, n))
            budget -= n
        return budget

    # -- completing a step ------------------------------------------------------------------------
    def _complete(self, plan: StepPlan) -> None:
        t = plan.end
        tally = self.tally
        gaps: dict[float, int] = {}
        produced = 0
        prefill_tokens = 0
        done: list[Request] = []
        for req in plan.decode:
            if req.aborted:
                continue
            req.computed += 1
            req.generated += 1
            produced += 1
            gap = t - req.last_token
            gaps[gap] = gaps.get(gap, 0) + 1
            req.last_token = t
            if req.generated >= req.max_tokens:
                done.append(req)
        for req, n in plan.prefill:
            if req.aborted:
                continue
            req.computed += n
            prefill_tokens += n
            if req.computed < req.prefill_target:
                continue
            req.generated += 1  # the step that completes a prefill samples a token
            produced += 1
            if req.first_token is None:
                req.first_token = t
                tally.observe("time_to_first_token_seconds", t - req.arrival)
            else:
                gap = t - req.last_token
                gaps[gap] = gaps.get(gap, 0) + 1
            req.last_token = t
            if req.generated >= req.max_tokens:
                done.append(req)
        for gap, n in gaps.items():
            tally.observe("inter_token_latency_seconds", gap, n)
        decode_seqs = len(plan.decode)
        tally.steps += 1
        tally.observe("iteration_tokens_total", prefill_tokens + produced)
        tally.prompt_tokens += prefill_tokens
        tally.generation_tokens += produced
        tally.busy_seconds += plan.end - plan.start
        if plan.cost is not None:
            tally.estimated_flops += plan.cost.flops
            tally.estimated_read_bytes += plan.cost.bytes
        layout = self.plant.layout
        tally.estimated_write_bytes += layout.kv_bytes((prefill_tokens + decode_seqs) * layout.pool_layers)
        for req in done:
            self._finish(req, t, "length" if req.prompt_tokens + req.max_tokens >= self.config.max_model_len else "stop")
        self.last_step = plan

    def _finish(self, req: Request, t: float, reason: str) -> None:
        self.running.remove(req)
        self.free_blocks += req.blocks
        req.blocks = 0
        tally = self.tally
        tally.request_success[reason] += 1
        scheduled = req.first_scheduled if req.first_scheduled is not None else t
        first = req.first_token if req.first_token is not None else t
        tally.observe("e2e_request_latency_seconds", t - req.arrival)
        tally.observe("request_queue_time_seconds", scheduled - req.arrival)
        tally.observe("request_inference_time_seconds", t - scheduled)
        tally.observe("request_prefill_time_seconds", first - scheduled)
        tally.observe("request_decode_time_seconds", t - first)
        tpot = (t - first) / (req.generated - 1) if req.generated > 1 else 0.0
        tally.observe("request_time_per_output_token_seconds", tpot)
        tally.observe("request_prompt_tokens", req.prompt_tokens)
        tally.observe("request_generation_tokens", req.generated)
        tally.observe("request_max_num_generation_tokens", req.max_tokens)
        tally.observe("request_params_max_tokens", req.max_tokens)
        tally.observe("request_params_n", 1)
        tally.observe("request_num_preemptions", req.preemptions)
        tally.observe("request_prefill_kv_computed_tokens", req.prompt_tokens)

    def abort_all(self) -> int:
        """Every client gives up at once and none comes after: running and waiting dropped, arrivals stopped
        (vLLM counts a client's disconnect as no finish reason); returns how many were running."""
        running = len(self.running)
        for req in self.running:
            self.free_blocks += req.blocks
            req.blocks, req.aborted = 0, True
        self.running, self.waiting, self._injected = [], deque(), []
        self.inflight = None
        self._stream = ArrivalStream(Workload(arrival_rate=0.0), self.config.seed, self.config.max_model_len)
        return running

    def abort_injected(self) -> int:
        """Drop every injected request, running or waiting (finished_reason "abort"); returns how many."""
        n = 0
        for req in [r for r in self.running if r.injected]:
            self.running.remove(req)
            self.free_blocks += req.blocks
            req.blocks, req.aborted = 0, True
            n += 1
        kept = deque(r for r in self.waiting if not r.injected)
        n += len(self.waiting) - len(kept)
        self.waiting = kept
        self._injected = [a for a in self._injected if not a.injected]
        self.tally.request_success["abort"] += n
        return n

    # -- what the state is ------------------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        return self.usable_blocks - self.free_blocks

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.usable_blocks if self.usable_blocks > 0 else 0.0

    @property
    def live_kv_tokens(self) -> int:
        return sum(r.computed for r in self.running)
