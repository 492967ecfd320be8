# The `cpu` cell: Debian bookworm (a local debootstrap image, docker/make-base-image.sh) and the cell's
# lock: torch CPU from the wheelhouse, Triton (its kernels run under TRITON_INTERPRET=1), transformers
# and the test tools. The source is not copied: it is mounted read-only at /src when the cell runs.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON_VERSION

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The host's CA bundle, not the base image's store: a TLS-intercepting proxy's CA is only on the host.
COPY ca-bundle.crt /etc/gdn-matrix/ca-bundle.crt
ENV PIP_CERT=/etc/gdn-matrix/ca-bundle.crt \
    SSL_CERT_FILE=/etc/gdn-matrix/ca-bundle.crt \
    REQUESTS_CA_BUNDLE=/etc/gdn-matrix/ca-bundle.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH}

# A venv, since Debian's Python is externally managed (PEP 668); the base must carry the cell's Python
# (the version reaches the check through the environment, never spliced into its code).
# The non-root user has a fixed uid and gid: a root runner shares the results mount with that group.
RUN python3 -c "import os, sys; v, w = '%d.%d' % sys.version_info[:2], os.environ['PYTHON_VERSION']; sys.exit(None if v == w else f'base image has Python {v}, the cell wants {w}')" \
    && python3 -m venv /opt/venv \
    && groupadd --gid 10001 gdn \
    && useradd --create-home --no-log-init --uid 10001 --gid 10001 --shell /bin/bash gdn

COPY wheelhouse/ /wheelhouse/
COPY lock.txt /etc/gdn-matrix/lock.txt
# Exactly the lock, every file checked against its recorded hash and nothing resolved here: the lock
# holds the whole dependency closure for this platform. torch+cpu is found in the wheelhouse.
RUN pip install --no-cache-dir --progress-bar off --require-hashes --no-deps --find-links /wheelhouse \
        -r /etc/gdn-matrix/lock.txt \
    && python -c "import sys, torch; sys.exit(None if torch.version.cuda is None else f'torch {torch.__version__} is a CUDA build')"

USER 10001:10001
WORKDIR /home/gdn
