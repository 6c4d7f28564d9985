"""Go-template snippets for alert annotations: the alert's own matchers, template queries, dashboard links.

Prometheus expands annotations with Go's text/template when it evaluates the alert, with `$labels`,
`$value` and a `query` function that runs PromQL at that instant (Prometheus docs, "Template
reference"). A description can so quote absolute values (seconds, tokens per step, preemptions/s)
beside the alert's own value, for the very series that fired, without changing the alert's labels.

The series is named by all of the alert's labels (`SELF`), not by a configured list: whatever the scrape
and relabelling added (pod, instance, cluster, region, ...) is matched as it is, so the same text serves
every topology config, and the Helm chart's template equals `rooflight rules`' output without knowing them.
"""

from __future__ import annotations

# `$self`: the alert's labels as PromQL matchers, each followed by ", " (a trailing comma is valid PromQL).
# Must come first in a description that uses query_value or first_label.
# A filtering alert (`x == 0`) keeps the metric's name among its labels; it is not a matcher to repeat.
SELF = (
    '{{ $self := "" }}{{ range $k, $v := $labels }}{{ if ne $k "__name__" }}'
    '{{ $self = printf "%s%s=%q, " $self $k $v }}{{ end }}{{ end }}'
)

DASHBOARD_RANGE = "from=now-3h&to=now"  # the onset of a 10m detector window and a 1h burn row both show


def _printf(query: str, args: tuple[str, ...]) -> str:
    """`printf "<query>" $self "<arg>"...`: %[1]s in `query` is $self, %[2]q the first arg, and so on."""
    if '"' in query or "\\" in query:
        raise ValueError(f"write quoted values as %[n]q arguments, not in the query: {query!r}")
    quoted = "".join(f' "{arg}"' for arg in args)
    return f'printf "{query}" $self{quoted}'


def query_value(query: str, *args: str, pipe: str = 'printf "%.3g"', unit: str = "", missing: str = "unknown") -> str:
    """The first sample of `query` run now, through `pipe`, then `unit`; `missing` when it returns nothing."""
    return (
        f"{{{{ with {_printf(query, args)} | query }}}}{{{{ . | first | value | {pipe} }}}}{unit}"
        f"{{{{ else }}}}{missing}{{{{ end }}}}"
    )


def first_label(query: str, label: str, *args: str, missing: str = "none") -> str:
    """The `label` of the first sample of `query` run now (a topk(1, ...) names the worst)."""
    return (
        f'{{{{ with {_printf(query, args)} | query }}}}{{{{ . | first | label "{label}" }}}}'
        f"{{{{ else }}}}{missing}{{{{ end }}}}"
    )


def each_label(query: str, label: str, *args: str, missing: str = "none") -> str:
    """The `label` of every sample of `query` run now, in order, comma-separated (the pods a page is about)."""
    return (
        f'{{{{ range $i, $s := {_printf(query, args)} | query | sortByLabel "{label}" }}}}'
        f'{{{{ if $i }}}}, {{{{ end }}}}{{{{ $s | label "{label}" }}}}{{{{ else }}}}{missing}{{{{ end }}}}'
    )


def first_sample(query: str, *args: str, unit: str = "", missing: str = "unknown") -> str:
    """The labels of the first sample of `query` run now, each as `name value` (only those it has), then its
    value in parentheses: a topk(1, ...) by replica names the worst one however the replicas are labelled."""
    return (
        f"{{{{ with {_printf(query, args)} | query }}}}{{{{ with . | first }}}}"
        f"{{{{ range $k, $v := .Labels }}}}{{{{ $k }}}} {{{{ $v }}}} {{{{ end }}}}"
        f"({{{{ .Value | printf \"%.3g\" }}}}{unit}){{{{ end }}}}{{{{ else }}}}{missing}{{{{ end }}}}"
    )


def dashboard_link(url: str, variables: tuple[tuple[str, str], ...]) -> str:
    """`url` with each dashboard variable set to the alert's label of that name, where the alert has it.

    `variables` are (dashboard variable, alert label) pairs. A label the alert lacks is left out, so the
    dashboard keeps its default (All) rather than filtering on an empty value.
    """
    parts = "".join(
        f"{{{{ if $labels.{label} }}}}&var-{var}={{{{ $labels.{label} | urlquery }}}}{{{{ end }}}}"
        for var, label in variables
    )
    return f"{url}?{DASHBOARD_RANGE}{parts}"


def same(*names: str) -> tuple[tuple[str, str], ...]:
    """(variable, label) pairs where the dashboard variable is named like the label."""
    return tuple((name, name) for name in names)
