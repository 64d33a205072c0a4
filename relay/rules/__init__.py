"""Filters, rewrites, masks and hooks, compiled from config into chains per hook point
(receive, send, tap) and run over event streams by `engine.RuleStream`. Sans-I/O: the
asyncio layers run chains in worker threads and decide what a failure stops.

`model`: what a rule is (RuleSpec, spec_of from a config entry, RuleKind, Outcome);
`compile`: the rules compiled (Rule, compile_rule); `chain`: Chain and RuleSet (and every
name of the two above); `runtime`: Rules, the set in force; `engine`: RuleStream;
`tables`, `mask`, `hooks`: table patterns, column masks, Python hooks."""
