"""The suite's root conftest: it enables the test bed's pytest plugin, which is opt-in.

The plugin brings the fixtures ``rabbitmq_testbed``, ``rabbitmq_faulty_testbed``,
``rabbitmq_unique_name`` and ``rabbitmq_spark``.
"""

pytest_plugins = ["smartclient.testing.pytest_plugin"]
