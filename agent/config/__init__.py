"""One home for the whole program's configuration: `rooflight run` (the agent and its in-process proxy),
`rooflight proxy` and `rooflight demo`.

settings.py declares every setting once (flag, ROOFLIGHT_ variable, file key, default, parser); values.py,
urls.py and yamlfile.py check what the user wrote and say what to fix (ConfigError, exit 2); agent.py,
proxy.py and demo.py build each command's frozen config from them. proxy.py and demo.py sit on the
floor of what they configure (tests/agent/test_layers.py): they read its SLO spellings and scenarios.
"""
