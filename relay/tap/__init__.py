"""The tap: row changes of the relay log served over TCP (length-prefixed msgpack frames)
to Spark and other readers. The client side (protocol, client, frames, spark) imports
neither the server nor the event loop, so Spark executors can load it alone."""
