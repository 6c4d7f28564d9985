"""One home for the whole program's settings: `rooflight run` (the agent and its in-process proxy),
`rooflight proxy`, `rooflight demo`, `rooflight plan` and `rooflight rules`.

settings.py declares every setting once (flag, ROOFLIGHT_ variable, file key, default, parser; setting.py is
the type, plan_settings.py and rules_settings.py the plan's and the rules' own parts); values.py, urls.py and
yamlfile.py check what the user wrote and say what to fix (ConfigError, exit 2); agent.py builds the agent's
frozen config from them. The proxy's and the demo's configs live with what they configure
(agent/proxy/config.py, agent/demo/config.py), the rules' with the rules (rules/config.py).
"""
