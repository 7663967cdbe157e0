# Stand-in for python:3.11-slim, built from Debian packages where no image registry is reachable
# (scripts/standin-images.sh; docs/deploy.md says what differs from the official image).
ARG DEBIAN_IMAGE=vistarl-standin/debian:bookworm
FROM ${DEBIAN_IMAGE}
ENV LANG=C.UTF-8
# Debian's python3 marks its site-packages as managed by apt (PEP 668); the official image's Python
# takes `pip install` as root, so the marker goes.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python-is-python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/* /usr/lib/python3*/EXTERNALLY-MANAGED
CMD ["python3"]
