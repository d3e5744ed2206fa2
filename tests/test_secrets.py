"""Candidate code never sees the user's credentials."""

import json
import os

from kernelscout.sandbox.pool import clean_env
from kernelscout.tools.schema import MeasureStatus

SECRETS = {
    "MY_SERVICE_API_KEY": "sk-should-not-leak",
    "GITHUB_TOKEN": "ghp-should-not-leak",
    "DB_PASSWORD": "hunter2",
    "AWS_SECRET_ACCESS_KEY": "aws-should-not-leak",
    "ANTHROPIC_BASE_URL": "http://provider.invalid",
    "OPENAI_ORG_ID": "org-should-not-leak",
    "some_lowercase_secret": "x",
}


def test_candidate_dumping_its_environment_finds_no_secrets(measure_source, tmp_path, monkeypatch):
    # A fresh pool, so the worker is spawned while the secrets are in this process's environment.
    from kernelscout.sandbox.pool import WorkerPool
    from kernelscout.tools.measure import MeasureRequest, measure
    from conftest import QUICK, SMALL_PROBLEM

    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    dump = tmp_path / "env.json"
    cand = tmp_path / "cand.py"
    cand.write_text(f'''
import json, os
import torch
import torch.nn as nn
with open({str(dump)!r}, "w") as f:
    json.dump(dict(os.environ), f)

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
    def forward(self, x, y):
        return torch.relu(x * self.scale + y) + 0.5 * x
''')
    prob = tmp_path / "problem.py"
    prob.write_text(SMALL_PROBLEM)
    with WorkerPool() as pool:
        m = measure(MeasureRequest(problem=str(prob), candidate=str(cand), device="cpu", run_dir=str(tmp_path / "run"), harness=QUICK), pool=pool)
    assert m.status == MeasureStatus.ok, m.message
    seen = json.loads(dump.read_text())
    assert seen, "the candidate should have dumped its environment"
    leaked = [k for k in SECRETS if k in seen]
    assert leaked == []
    assert all(v not in seen.values() for v in SECRETS.values())
    assert seen["HOME"] != os.environ.get("HOME")


def test_clean_env_keeps_what_kernels_need_and_drops_credentials(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("CUDA_AUTH_TOKEN", "nope")
    monkeypatch.setenv("HF_HOME", "/somewhere")
    env = clean_env("cpu", 2, 1 << 30, tmp_path)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_AUTH_TOKEN" not in env and "HF_HOME" not in env
    assert env["OMP_NUM_THREADS"] == "2" and env["TRITON_INTERPRET"] == "1"
