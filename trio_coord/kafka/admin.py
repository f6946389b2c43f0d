"""CreateTopics, DeleteTopics, CreatePartitions and DescribeConfigs: Kafka admin tools.

Its one job is to map the admin APIs onto the broker's topic manager, one
result per topic, each with Kafka's code for what went wrong. A topic has
one replica (replication factor -1 or 1; anything else is
INVALID_REPLICATION_FACTOR), partitions are placed by the broker (manual
assignments are INVALID_REQUEST) and topic configs cannot be set
(INVALID_CONFIG): what DescribeConfigs reports is the broker's own settings,
read-only, enough for admin tools and UIs to show a topic.
``validate_only`` checks a request and changes nothing.
"""

from __future__ import annotations

import datetime
from typing import Any, Final

from ..core.validation import validate_topic_name
from ..protocol.errors import CoordError
from ..security.acl import CLUSTER
from .codec import KafkaCode, make, nested, response_schema
from .dispatch import Api, RequestContext
from .errors import KafkaError, kafka_code
from .metadata import topic_id

__all__ = ["APIS"]

_NO_THROTTLE: Final = datetime.timedelta(0)
_TOPIC: Final = 2
_BROKER: Final = 4
_DEFAULT_PARTITIONS: Final = 1
_DEFAULT_SOURCE: Final = 5  # DEFAULT_CONFIG
_STATIC_SOURCE: Final = 4  # STATIC_BROKER_CONFIG


def _error(exc: Exception) -> tuple[KafkaCode, str]:
    return kafka_code(exc), str(exc)


# -- CreateTopics ----------------------------------------------------------------------------


async def _create_topics(ctx: RequestContext, body: Any) -> Any:
    service = ctx.front.service
    schema = response_schema(19, ctx.version)
    result_cls = nested(schema, "CreatableTopicResult")
    results = []
    for topic in body.topics:
        count = _DEFAULT_PARTITIONS if topic.num_partitions == -1 else topic.num_partitions
        code, message = KafkaCode.none, None
        try:
            if not ctx.allowed("create", "cluster", CLUSTER) and not ctx.allowed(
                "create", "topic", topic.name
            ):
                raise KafkaError(
                    KafkaCode.topic_authorization_failed,
                    f"{ctx.principal} may not CREATE topic {topic.name!r}",
                )
            if topic.replication_factor not in (-1, 1):
                raise KafkaError(
                    KafkaCode.invalid_replication_factor,
                    f"replication factor {topic.replication_factor}: this broker keeps one "
                    "replica (use -1 or 1)",
                )
            if topic.assignments:
                raise KafkaError(
                    KafkaCode.invalid_request, "manual replica assignments are not supported"
                )
            if topic.configs:
                names = ", ".join(c.name for c in topic.configs)
                raise KafkaError(
                    KafkaCode.invalid_config,
                    f"topic configs cannot be set on this broker ({names}); its own settings "
                    "apply to every topic",
                )
            if body.validate_only:
                validate_topic_name(topic.name)
                if topic.name in service.topics.partitions:
                    raise KafkaError(
                        KafkaCode.topic_already_exists, f"topic {topic.name!r} exists already"
                    )
            else:
                await service.topics.create_topic(topic.name, count)
        except (KafkaError, CoordError) as exc:
            code, message = _error(exc)
        ok = code is KafkaCode.none
        results.append(
            make(
                result_cls,
                name=topic.name,
                topic_id=topic_id(service.topics, topic.name),
                error_code=code,
                error_message=message,
                num_partitions=count if ok else -1,
                replication_factor=1 if ok else -1,
                configs=None,
            )
        )
    return make(schema, throttle_time=_NO_THROTTLE, topics=tuple(results))


# -- DeleteTopics ----------------------------------------------------------------------------


async def _delete_topics(ctx: RequestContext, body: Any) -> Any:
    service = ctx.front.service
    schema = response_schema(20, ctx.version)
    result_cls = nested(schema, "DeletableTopicResult")
    if ctx.version >= 6:
        names: list[str | None] = [t.name for t in body.topics]
    else:
        names = list(body.topic_names)
    await service.read_topics([n for n in names if n and n not in service.topics.partitions])
    results = []
    for name in names:
        code, message = KafkaCode.none, None
        gone = topic_id(service.topics, name or "")  # (before the topic and its id go)
        try:
            if name is None:
                raise KafkaError(
                    KafkaCode.unknown_topic_id, "topics are deleted by name on this broker"
                )
            if not ctx.allowed("delete", "topic", name):
                raise KafkaError(
                    KafkaCode.topic_authorization_failed,
                    f"{ctx.principal} may not DELETE topic {name!r}",
                )
            await service.topics.delete_topic(name)
        except (KafkaError, CoordError) as exc:
            code, message = _error(exc)
        results.append(
            make(
                result_cls,
                name=name,
                topic_id=gone,
                error_code=code,
                error_message=message,
            )
        )
    return make(schema, throttle_time=_NO_THROTTLE, responses=tuple(results))


# -- CreatePartitions ------------------------------------------------------------------------


async def _create_partitions(ctx: RequestContext, body: Any) -> Any:
    service = ctx.front.service
    schema = response_schema(37, ctx.version)
    result_cls = nested(schema, "CreatePartitionsTopicResult")
    await service.read_topics(
        [t.name for t in body.topics if t.name not in service.topics.partitions]
    )
    results = []
    for topic in body.topics:
        code, message = KafkaCode.none, None
        try:
            if topic.assignments:
                raise KafkaError(
                    KafkaCode.invalid_request, "manual replica assignments are not supported"
                )
            if not ctx.allowed("alter", "topic", topic.name):
                raise KafkaError(
                    KafkaCode.topic_authorization_failed,
                    f"{ctx.principal} may not ALTER topic {topic.name!r}",
                )
            current = service.topics.partitions.get(topic.name)
            if current is None:
                raise KafkaError(
                    KafkaCode.unknown_topic_or_partition, f"topic {topic.name!r} does not exist"
                )
            if body.validate_only:
                if topic.count <= current:
                    raise KafkaError(
                        KafkaCode.invalid_partitions,
                        f"topic {topic.name!r} has {current} partitions; the new count must "
                        "be larger",
                    )
            else:
                await service.topics.add_partitions(topic.name, topic.count)
        except (KafkaError, CoordError) as exc:
            code, message = _error(exc)
        results.append(make(result_cls, name=topic.name, error_code=code, error_message=message))
    return make(schema, throttle_time=_NO_THROTTLE, results=tuple(results))


# -- DescribeConfigs -------------------------------------------------------------------------


async def _describe_configs(ctx: RequestContext, body: Any) -> Any:
    return _describe_configs_now(ctx, body)


def _describe_configs_now(ctx: RequestContext, body: Any) -> Any:
    front = ctx.front
    service = front.service
    schema = response_schema(32, ctx.version)
    result_cls = nested(schema, "DescribeConfigsResult")
    entry_cls = nested(schema, "DescribeConfigsResourceResult")
    results = []
    for resource in body.resources:
        code, message = KafkaCode.none, None
        configs: dict[str, str] = {}
        if resource.resource_type == _TOPIC and not ctx.allowed(
            "describe", "topic", resource.resource_name
        ):
            code = KafkaCode.topic_authorization_failed
            message = f"{ctx.principal} may not DESCRIBE topic {resource.resource_name!r}"
        elif resource.resource_type == _BROKER and not ctx.allowed("describe", "cluster", CLUSTER):
            code = KafkaCode.cluster_authorization_failed
            message = f"{ctx.principal} may not DESCRIBE the cluster"
        elif resource.resource_type == _TOPIC:
            if resource.resource_name not in service.topics.partitions:
                code = KafkaCode.unknown_topic_or_partition
                message = f"topic {resource.resource_name!r} does not exist"
            else:
                configs = dict(front.limits.topic_configs)
        elif resource.resource_type == _BROKER:
            if resource.resource_name not in ("", str(service.broker_id)):
                code = KafkaCode.invalid_request
                message = f"this is broker {service.broker_id}"
            else:
                configs = dict(front.limits.broker_configs)
        else:
            code = KafkaCode.invalid_request
            message = f"resource type {resource.resource_type} has no configs here"
        keys = resource.configuration_keys
        if keys:
            configs = {k: v for k, v in configs.items() if k in keys}
        source = _DEFAULT_SOURCE if resource.resource_type == _TOPIC else _STATIC_SOURCE
        results.append(
            make(
                result_cls,
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=tuple(
                    make(
                        entry_cls,
                        name=name,
                        value=value,
                        read_only=True,
                        is_default=True,
                        config_source=source,
                        is_sensitive=False,
                        synonyms=(),
                        config_type=0,
                        documentation=None,
                    )
                    for name, value in sorted(configs.items())
                ),
            )
        )
    return make(schema, throttle_time=_NO_THROTTLE, results=tuple(results))


APIS: Final = [
    Api(19, 2, 7, _create_topics, authorizes=True),
    Api(20, 1, 6, _delete_topics, authorizes=True),
    Api(37, 0, 3, _create_partitions, authorizes=True),
    Api(32, 1, 4, _describe_configs, now=_describe_configs_now, authorizes=True),
]
