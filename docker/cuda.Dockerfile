# The CUDA cells: an nvidia/cuda runtime image and the cell's lock: torch (PyPI's build, with the CUDA
# wheels it depends on), flash-linear-attention (fla-core) as the external peer backend, the cell's
# Triton, transformers and the test tools.
# The source is not copied: it is mounted read-only at /src when the cell runs.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON_VERSION
ARG CUDA_VERSION

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The host's CA bundle, not the base image's store: a TLS-intercepting proxy's CA is only on the host.
COPY ca-bundle.crt /etc/gdn-matrix/ca-bundle.crt
ENV PIP_CERT=/etc/gdn-matrix/ca-bundle.crt \
    SSL_CERT_FILE=/etc/gdn-matrix/ca-bundle.crt \
    REQUESTS_CA_BUNDLE=/etc/gdn-matrix/ca-bundle.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH}

# The distribution's own Python: apt versions are not pinned since they move with every point release
# of the base image; the cell's Python minor is asserted instead and the whole stack is pinned via pip.
# The non-root user has a fixed uid and gid: a root runner shares the results mount with that group.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -c "import os, sys; v, w = '%d.%d' % sys.version_info[:2], os.environ['PYTHON_VERSION']; sys.exit(None if v == w else f'base image has Python {v}, the cell wants {w}')" \
    && python3 -m venv /opt/venv \
    && groupadd --gid 10001 gdn \
    && useradd --create-home --no-log-init --uid 10001 --gid 10001 --shell /bin/bash gdn

COPY wheelhouse/ /wheelhouse/
COPY lock.txt /etc/gdn-matrix/lock.txt
# Exactly the lock, every file checked against its recorded hash and nothing resolved here: the lock
# holds the whole dependency closure, including a Triton other than the one torch pins where the cell
# overrides it (cuda-triton39). The check fails the build, not the cell, when PyPI's torch targets
# another CUDA than the cell's (the value comes through the environment, never spliced into code).
RUN pip install --no-cache-dir --progress-bar off --require-hashes --no-deps --find-links /wheelhouse \
        -r /etc/gdn-matrix/lock.txt \
    && python -c "import os, sys, torch; c, w = torch.version.cuda or 'none', os.environ['CUDA_VERSION']; sys.exit(None if c == w else f'torch {torch.__version__} is built for CUDA {c}, the cell wants {w}')"

USER 10001:10001
WORKDIR /home/gdn
