"""The private PostgreSQL, Redis and dockerd of ``own_services`` start, stop and come back, and the shared
instances other tests use stay untouched."""

from __future__ import annotations

import pytest

from tests.conftest import docker_status, require
from tests.support.own_services import OwnDockerd, OwnPostgres, OwnRedis, mini_task_images
from tests.support.worker_fixtures import redis_ping

pytestmark = [pytest.mark.services, pytest.mark.docker, pytest.mark.slow]

FAULT_TASKS = ["humanfmt__humanfmt-1", "dslib__dslib-1"]


def test_own_postgres_stops_and_starts_again():
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    with OwnPostgres() as pg:
        assert ":5432/" not in pg.url
        engine = sa.create_engine(pg.url, poolclass=NullPool)
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (x int)"))
            conn.execute(sa.text("INSERT INTO t VALUES (7)"))
        pg.stop()
        with pytest.raises(sa.exc.OperationalError):
            engine.connect()
        pg.start()
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT x FROM t")).scalar() == 7
        engine.dispose()
    assert not pg.dir.exists()


def test_own_redis_keeps_keys_across_a_clean_shutdown():
    import redis

    with OwnRedis() as own:
        assert own.port != 6379
        redis.Redis.from_url(own.url).set("survives", "yes")
        own.shutdown()
        assert not redis_ping(own.url)
        own.start()
        assert redis.Redis.from_url(own.url).get("survives") == b"yes"
    assert not own.dir.exists() and own.process.poll() is not None


def test_own_dockerd_runs_a_task_container_and_restarts():
    import docker

    require(*docker_status())
    shared = docker.from_env()
    tags = mini_task_images(FAULT_TASKS)
    with OwnDockerd() as own:
        client = docker.DockerClient(base_url=own.host)
        assert shared.ping() and client.ping()
        own.load_images(tags)
        for tag in tags:  # the same image ids: a task tag computed from the base image id stays valid
            assert client.images.get(tag).id == shared.images.get(tag).id
        client.containers.run(tags[1], ["true"], network_mode="none", remove=True)
        assert shared.ping()
        own.restart()
        assert client.info()["Images"] == len(tags)
        assert shared.ping()
        client.close()
    assert not own.dir.exists()
    assert shared.ping()
