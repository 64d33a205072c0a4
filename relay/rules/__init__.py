"""Filters, rewrites, masks and hooks, compiled from config into chains per hook point
(receive, send, tap) and run over event streams by `engine.RuleStream`. Sans-I/O: the
asyncio layers run chains in worker threads and decide what a failure stops."""
