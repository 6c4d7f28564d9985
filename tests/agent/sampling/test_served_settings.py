"""--ep and --draft-model: read, checked, and carried into the target's constants."""

from __future__ import annotations

import pytest

from rooflight.agent.cli import draft_for, main
from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline.models import preset
from rooflight.agent.config import agent as cfg
from rooflight.agent.sampling.sampler import Agent

URL = "http://127.0.0.1:9"


def test_ep_and_draft_model_reach_the_targets_constants() -> None:
    config = cfg.build({}, {}, {"engine_url": [URL], "model": "deepseek-v3", "ep": 8, "draft_model": "llama-3.2-1b"})
    target = config.targets[0]
    assert (target.ep, target.draft_model) == (8, "llama-3.2-1b")
    assert draft_for(target) == preset("llama-3.2-1b")
    constants = Agent(config)._constants_for(target, preset("deepseek-v3"), 1)
    assert constants.expert_parallel_size == 8 and constants.layout.expert_ranks == 8
    assert constants.draft == preset("llama-3.2-1b")


def test_bad_ep_and_draft_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="ep"):
        cfg.build({}, {}, {"engine_url": [URL], "ep": 0})
    with pytest.raises(ConfigError, match="not both"):
        cfg.build({}, {}, {"engine_url": [URL], "draft_model": "llama-3.2-1b", "draft_model_config": "/x.json"})
    target = cfg.build({}, {}, {"engine_url": [URL], "draft_model": "no-such-model"}).targets[0]
    with pytest.raises(ConfigError, match="draft model: unknown model preset"):
        draft_for(target)
    assert main(["run", "--engine-url", URL, "--draft-model", "no-such-model", "--check-only"]) == 2
