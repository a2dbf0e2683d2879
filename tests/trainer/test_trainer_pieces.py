"""The trainer's pieces in one process: exit-code mapping, launch planning, data positions,
pipeline splits, bit flips, the lr schedule."""

from __future__ import annotations

import argparse
import math

import pytest

from railyard.protocol.exitcodes import ExitCode
from railyard.protocol.ranktable import PodEntry, RankEntry, RankTable
from railyard_trainer.config import ConfigError
from railyard_trainer.launch_plan import plan_launch
from railyard_trainer.launcher import build_parser
from railyard_trainer.workers import most_specific


def test_launcher_reports_the_root_cause_not_its_consequences() -> None:
    assert most_specific([0, 0]) == 0
    assert most_specific([ExitCode.INFRASTRUCTURE, ExitCode.APPLICATION, 143]) == ExitCode.APPLICATION
    assert most_specific([ExitCode.INFRASTRUCTURE, 42]) == 42
    assert most_specific([ExitCode.HANG_OR_STRAGGLER, ExitCode.INFRASTRUCTURE]) == ExitCode.HANG_OR_STRAGGLER
    assert most_specific([ExitCode.HANG_OR_STRAGGLER, ExitCode.SDC_DETECTED]) == ExitCode.SDC_DETECTED
    assert most_specific([137, ExitCode.INFRASTRUCTURE]) == ExitCode.INFRASTRUCTURE
    assert most_specific([ExitCode.CONFIG_PERMANENT, ExitCode.APPLICATION]) == ExitCode.CONFIG_PERMANENT


def _table(pods: int = 2, per_pod: int = 2) -> RankTable:
    ranks = tuple(RankEntry(rank=r, node=f"n{r // per_pod}", pod_index=r // per_pod, local_rank=r % per_pod, rail=r % per_pod, pp=0, dp=r // 2, tp=r % 2) for r in range(pods * per_pod))
    return RankTable(job="j", attempt=3, pp=1, dp=pods * per_pod // 2, tp=2, procs_per_node=per_pod,
                     pods=tuple(PodEntry(i, f"n{i}", "localhost") for i in range(pods)), ranks=ranks,
                     master_addr="localhost", master_port=1234)


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_plan_from_the_operator_rank_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "rt.json"
    path.write_text(_table().to_json())
    plan = plan_launch(_args(), {"RAILYARD_RANK_TABLE": str(path), "RAILYARD_POD_INDEX": "1", "RAILYARD_ATTEMPT": "3"})
    assert [w.rank for w in plan.workers] == [2, 3]
    assert [w.coords for w in plan.workers] == [(0, 1, 0), (0, 1, 1)]
    assert plan.workers[0].mesh_shape == (1, 2, 2)
    assert plan.master_addr in ("127.0.0.1", "::1")  # a DNS name resolved in Python
    assert plan.config.attempt == 3


def test_plan_refuses_a_config_that_disagrees_with_the_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "rt.json"
    path.write_text(_table().to_json())
    with pytest.raises(ConfigError, match=r"parallelism\.pipeline: config says 2 but the rank table has 1"):
        plan_launch(_args("--pp", "2"), {"RAILYARD_RANK_TABLE": str(path), "RAILYARD_POD_INDEX": "0"})
    with pytest.raises(ConfigError, match="RAILYARD_POD_INDEX"):
        plan_launch(_args(), {"RAILYARD_RANK_TABLE": str(path)})
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        plan_launch(_args(), {"RAILYARD_RANK_TABLE": str(path), "RAILYARD_POD_INDEX": "0", "MASTER_ADDR": "no-such-host.invalid",
                              "RAILYARD_RENDEZVOUS_WAIT_S": "0"})
    with pytest.raises(ConfigError, match="RAILYARD_RENDEZVOUS_WAIT_S: expected a number of seconds"):
        plan_launch(_args(), {"RAILYARD_RANK_TABLE": str(path), "RAILYARD_POD_INDEX": "0", "RAILYARD_RENDEZVOUS_WAIT_S": "soon"})


def test_the_launcher_waits_for_the_rendezvous_name_to_be_served(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Pod 1 may start before pod 0 has an address, so before its DNS name resolves: the launcher
    # keeps asking (within RAILYARD_RENDEZVOUS_WAIT_S) instead of failing the job as misconfigured.
    from railyard_trainer import launch_plan

    path = tmp_path / "rt.json"
    path.write_text(_table().to_json())
    real = launch_plan.socket.getaddrinfo
    asked: list[str] = []

    def served_on_the_third_ask(host, port, *a, **kw):  # type: ignore[no-untyped-def]
        asked.append(host)
        if host == "llm-0.llm.ml.svc":
            if len(asked) < 3:
                raise launch_plan.socket.gaierror(-2, "Name or service not known")
            return real("127.0.0.1", port, *a, **kw)
        return real(host, port, *a, **kw)

    monkeypatch.setattr(launch_plan.socket, "getaddrinfo", served_on_the_third_ask)
    env = {"RAILYARD_RANK_TABLE": str(path), "RAILYARD_POD_INDEX": "1", "MASTER_ADDR": "llm-0.llm.ml.svc"}
    plan = plan_launch(_args(), env | {"RAILYARD_RENDEZVOUS_WAIT_S": "60"})
    assert plan.master_addr == "127.0.0.1" and asked == ["llm-0.llm.ml.svc"] * 3
    # never served: a configuration error that says how long it waited
    asked.clear()
    monkeypatch.setattr(launch_plan.socket, "getaddrinfo", lambda *a, **kw: (_ for _ in ()).throw(launch_plan.socket.gaierror(-2, "unknown")))
    with pytest.raises(ConfigError, match=r"cannot resolve 'llm-0.llm.ml.svc'.*waited \d+ s, RAILYARD_RENDEZVOUS_WAIT_S"):
        plan_launch(_args(), env | {"RAILYARD_RENDEZVOUS_WAIT_S": "0.3"})


def test_plan_names_the_variable_that_is_not_a_number(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "rt.json"
    path.write_text(_table().to_json())
    with pytest.raises(ConfigError, match="RAILYARD_POD_INDEX: expected a whole number >= 0, got 'one'"):
        plan_launch(_args(), {"RAILYARD_RANK_TABLE": str(path), "RAILYARD_POD_INDEX": "one"})
    with pytest.raises(ConfigError, match="MASTER_PORT: expected a whole number"):
        plan_launch(_args(), {"MASTER_PORT": "29500/tcp"})


def test_plan_by_hand_builds_a_single_node_table() -> None:
    plan = plan_launch(_args("--nproc-per-node", "4", "--tp", "2", "--pp", "2", "--steps", "3"), {})
    assert [w.coords for w in plan.workers] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    assert plan.config.trainer.steps == 3
    with pytest.raises(ConfigError, match=r"trainer\.steps"):
        plan_launch(_args("--steps", "0"), {})


torch = pytest.importorskip("torch")


@pytest.mark.torch
def test_exit_codes_of_worker_failures() -> None:
    import torch.distributed as dist

    from railyard_trainer.faults import InjectedExit
    from railyard_trainer.hooks import HangDetected, SDCDetected
    from railyard_trainer.worker import exit_code_for

    assert exit_code_for(ConfigError(["x: bad"])) == ExitCode.CONFIG_PERMANENT
    assert exit_code_for(SDCDetected("kat", rank=1)) == ExitCode.SDC_DETECTED
    assert exit_code_for(HangDetected("stuck")) == ExitCode.HANG_OR_STRAGGLER
    assert exit_code_for(dist.DistBackendError("NCCL watchdog")) == ExitCode.INFRASTRUCTURE
    assert exit_code_for(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")) == ExitCode.INFRASTRUCTURE
    try:
        try:
            raise RuntimeError("Connection reset by peer")
        except RuntimeError as inner:
            raise ValueError("pipeline recv failed") from inner
    except ValueError as outer:
        assert exit_code_for(outer) == ExitCode.INFRASTRUCTURE
    assert exit_code_for(InjectedExit(42)) == 42
    assert exit_code_for(RuntimeError("shape mismatch")) == ExitCode.APPLICATION
    assert exit_code_for(ZeroDivisionError()) == ExitCode.APPLICATION


@pytest.mark.torch
def test_global_batches_do_not_depend_on_the_data_parallel_size() -> None:
    from railyard_trainer.data import ShardedBatches, SyntheticLanguage

    src = SyntheticLanguage(256, seed=3)

    def global_batches(dp: int, steps: int) -> list[torch.Tensor]:
        loaders = [ShardedBatches(src, batch_size=8, seq_len=16, dp_rank=r, dp_size=dp, device=torch.device("cpu")) for r in range(dp)]
        return [torch.cat([ld.next_batch()[0] for ld in loaders]) for _ in range(steps)]

    one, four = global_batches(1, 3), global_batches(4, 3)
    assert all(torch.equal(a, b) for a, b in zip(one, four, strict=True))
    assert not torch.equal(one[0], one[1])

    # Resume on another dp size: position in global samples.
    a = ShardedBatches(src, batch_size=8, seq_len=16, dp_rank=0, dp_size=2, device=torch.device("cpu"))
    a.next_batch()
    b = ShardedBatches(src, batch_size=8, seq_len=16, dp_rank=0, dp_size=1, device=torch.device("cpu"))
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.next_batch()[0], one[1])
    # Another global batch size continues at the same sample: nothing skipped or repeated.
    c = ShardedBatches(src, batch_size=6, seq_len=16, dp_rank=0, dp_size=1, device=torch.device("cpu"))
    c.load_state_dict(a.state_dict())
    assert torch.equal(c.next_batch()[0], one[1][:6])
    with pytest.raises(ConfigError, match=r"trainer\.seqLen"):
        ShardedBatches(src, batch_size=8, seq_len=32, dp_rank=0, dp_size=1, device=torch.device("cpu")).load_state_dict(a.state_dict())


@pytest.mark.torch
def test_synthetic_language_is_learnable_and_files_are_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from railyard_trainer.config import DatasetConfig
    from railyard_trainer.data import SyntheticLanguage, build_source

    src = SyntheticLanguage(256, seed=0)
    assert src.entropy < math.log(256) / 4
    assert (src.sample(5, 100) == src.sample(5, 100)).all()
    (tmp_path / "a.txt").write_bytes(b"hello railyard " * 10)
    files = build_source(DatasetConfig(type="files", path=str(tmp_path)), vocab_size=256, seed=0, seq_len=8)
    assert bytes(files.sample(0, 9).tolist()) == b"hello rai"
    with pytest.raises(ConfigError, match=r"trainer\.dataset\.path"):
        build_source(DatasetConfig(type="files", path=str(tmp_path / "missing")), vocab_size=256, seed=0, seq_len=8)


@pytest.mark.torch
def test_pipeline_stages_are_the_model_cut_by_layers() -> None:
    import copy

    from railyard_trainer.model import Transformer
    from railyard_trainer.model_args import ModelArgs
    from railyard_trainer.pipeline import check_microbatches, stage_layer_ranges

    assert stage_layer_ranges(5, 2) == [range(0, 3), range(3, 5)]
    assert [len(r) for r in stage_layer_ranges(32, 8)] == [4] * 8
    assert check_microbatches("1F1B", 2, 0, 4) == 2
    with pytest.raises(ConfigError, match=r"parallelism\.microbatches"):
        check_microbatches("GPipe", 4, 2, 8)

    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=32, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=64, max_seq_len=64))
    first, last = copy.deepcopy(model), copy.deepcopy(model)
    del first.layers["2"]
    first.norm = first.output = None
    del last.layers["0"], last.layers["1"]
    last.tok_embeddings = None
    tokens = torch.randint(0, 64, (2, 10))
    torch.testing.assert_close(last(first(tokens)), model(tokens))
    names = {n for m in (first, last) for n, _ in m.named_parameters()}
    assert names == {n for n, _ in model.named_parameters()}


@pytest.mark.torch
def test_bit_flip_hits_a_high_exponent_bit() -> None:
    from railyard_trainer.faults import flip_high_bit

    t = torch.full((3, 3), 0.01)
    index, before, after = flip_high_bit(t)
    assert index == 4 and before == pytest.approx(0.01) and abs(after) > 1e30
    assert t.view(-1)[4].item() == after and t.view(-1)[3].item() == pytest.approx(0.01)
    b = torch.full((4,), 0.5, dtype=torch.bfloat16)
    assert abs(flip_high_bit(b)[2]) > 1e30


@pytest.mark.torch
def test_a_slow_fault_is_logged_once_and_slows_the_device_from_its_step() -> None:
    from railyard_trainer.config import FaultSpec
    from railyard_trainer.faults import FaultInjector

    logged: list[dict[str, object]] = []
    faults = FaultInjector((FaultSpec(kind="slow", rank=0, step=2, factor=1.5),), rank=0, log=lambda event, **kw: logged.append({"event": event, **kw}))
    for step in (1, 2, 3):
        faults.before_step(step)
        assert faults.slow_down(step, 0.002) == (0.0 if step == 1 else pytest.approx(0.001))  # forward/backward
        assert faults.slow_factor(step) == (1.0 if step == 1 else 1.5)  # the speed probe's work
    assert logged == [{"event": "fault", "rank": 0, "kind": "slow", "step": 2, "factor": 1.5}]
    other_rank = FaultInjector((FaultSpec(kind="slow", rank=0, step=2, factor=1.5),), rank=1, log=lambda event, **kw: None)
    assert other_rank.slow_factor(3) == 1.0


@pytest.mark.torch
def test_warmup_cosine_schedule_resumes_from_its_state() -> None:
    from railyard_trainer.train_state import WarmupCosine

    def sched() -> WarmupCosine:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return WarmupCosine(opt, peak_lr=1.0, warmup_steps=4, total_steps=20)

    a = sched()
    lrs = []
    for _ in range(20):
        lrs.append(a.get_last_lr()[0])
        a.step()
    assert lrs[0] == pytest.approx(0.2) and lrs[3] == pytest.approx(0.8)
    assert max(lrs) <= 1.0 and lrs[4] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1, abs=0.02)
    b = sched()
    b.load_state_dict({"steps_taken": 7})
    assert b.get_last_lr()[0] == pytest.approx(lrs[7])
