"""The engine kit: everything an inference engine imports to rank its prefix cache by kvcast's
priority table, and nothing of the daemon's.

What is here, one job per module:

- ``client``: the table read from Redis, HTTP or a file and refreshed in the background
  (``TableClient``);
- ``plugins``: the entry points vLLM and SGLang load by themselves (``register_vllm``,
  ``register_sglang``);
- ``adapters``: the engines' eviction hooks (``adapters.vllm``, ``adapters.sglang``), the state
  a request carries (``adapters.request_state``) and the cache of a table state's values both
  adapters read (``adapters.state_values``);
- ``index``: ``PriorityIndex``, a table read into an immutable lookup, and the IAC and
  ``density`` priorities over it;
- ``checks``: the checks of a table document's fields (``TableError``);
- ``laws``: the law ``(p, mu, sigma)`` a table row gives the ``density`` policy;
- ``density``: the hit density of a state at an age, and its ``DensityCurve``;
- ``ages``: the age grid those curves are tabulated on (one definition of a bucket);
- ``ranking``: many candidates ranked by density at once (numpy on first use, if installed).

The rule (``tests/test_architecture.py`` checks it on the imports read from the source):

1. The kit imports the standard library, itself, and among kvcast modules only those named in
   the test's ``KIT_STATS`` (``kvcast.stats.store_url``: the store URL grammar and the Redis key
   layout, which the daemon writes by). Third-party packages only lazily, one by one as the
   test's ``LAZY_THIRD_PARTY`` lists them (redis-py, the engines themselves). So an engine
   loads it without numpy, torch, Kafka or the daemon.
2. Inside the kit, the adapters never import the client or the plugins (they rank by anything
   holding an index); the plugins are the only glue between the two.
3. Outside the kit, modules import only its public modules (the test's ``KIT_PUBLIC``:
   ``client``, ``index``, ``plugins``, ``adapters.vllm``, ``adapters.sglang``); ``kvcast.lab``
   (simulators, reports, the benches) may import any of it.
4. What the daemon side needs to *write* a table stays in ``kvcast.stats``
   (``kvcast.stats.table``): ``kvcast.stats`` never imports the kit.
"""
