# The `cpu` cell: Debian bookworm (a local debootstrap image, docker/make-base-image.sh), torch CPU
# from the wheelhouse, Triton (its kernels run under TRITON_INTERPRET=1), transformers and the pinned
# test tools. The source is not copied: it is mounted read-only at /src when the cell runs.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON_VERSION
ARG TORCH_VERSION
ARG TRITON_VERSION
ARG TRANSFORMERS_VERSION
# Index settings for air-gapped sites (images.py passes them when set in the environment).
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The host's CA bundle, not the base image's store: a TLS-intercepting proxy's CA is only on the host.
COPY ca-bundle.crt /etc/gdn-matrix/ca-bundle.crt
ENV PIP_CERT=/etc/gdn-matrix/ca-bundle.crt \
    SSL_CERT_FILE=/etc/gdn-matrix/ca-bundle.crt \
    REQUESTS_CA_BUNDLE=/etc/gdn-matrix/ca-bundle.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH}

# A venv, since Debian's Python is externally managed (PEP 668); the base must carry the cell's Python.
# The non-root user has a fixed uid so that the host can make the results mount writable for it.
RUN python3 -c "import sys; v = '%d.%d' % sys.version_info[:2]; sys.exit(None if v == '${PYTHON_VERSION}' else f'base image has Python {v}, the cell wants ${PYTHON_VERSION}')" \
    && python3 -m venv /opt/venv \
    && groupadd --gid 10001 gdn \
    && useradd --create-home --no-log-init --uid 10001 --gid 10001 --shell /bin/bash gdn

COPY wheelhouse/ /wheelhouse/
COPY requirements-test.txt /etc/gdn-matrix/requirements-test.txt
# The wheelhouse's torch+cpu outranks the index's CUDA build of the same version (PEP 440 local label).
# The checks fail the build, not the cell, when pip resolved anything but the cell's versions.
RUN pip install --no-cache-dir --progress-bar off --find-links /wheelhouse \
        "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}" "transformers==${TRANSFORMERS_VERSION}" \
        -r /etc/gdn-matrix/requirements-test.txt \
    && python -c "import sys; from importlib.metadata import version; a = sys.argv[1:]; bad = {p: version(p) for p, w in zip(a[::2], a[1::2]) if version(p).split('+')[0] != w}; sys.exit(f'installed versions differ from the cell: {bad}' if bad else None)" \
        torch "${TORCH_VERSION}" triton "${TRITON_VERSION}" transformers "${TRANSFORMERS_VERSION}" \
    && python -c "import sys, torch; sys.exit(None if torch.version.cuda is None else f'torch {torch.__version__} is a CUDA build')"

USER 10001:10001
WORKDIR /home/gdn
