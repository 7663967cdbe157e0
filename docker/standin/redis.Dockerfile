# Stand-in for redis:7.4-alpine, built from Debian packages where no image registry is reachable
# (scripts/standin-images.sh; docs/deploy.md says what differs from the official image).
ARG DEBIAN_IMAGE=vistarl-standin/debian:bookworm
FROM ${DEBIAN_IMAGE}
# As in the official image: the redis user is uid 999, and the data lives in /data, owned by it.
# hadolint ignore=DL3008
RUN groupadd --system --gid 999 redis && useradd --system --uid 999 --gid redis --home-dir /var/lib/redis redis \
    && apt-get update && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* && mkdir /data && chown redis:redis /data
COPY redis-entrypoint.sh /usr/local/bin/standin-entrypoint
WORKDIR /data
VOLUME /data
USER 999:999
EXPOSE 6379
ENTRYPOINT ["standin-entrypoint"]
CMD ["redis-server"]
