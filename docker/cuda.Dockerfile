# The CUDA cells: an nvidia/cuda runtime image, torch built for the cell's CUDA, flash-linear-attention
# (fla-core) as the external peer backend, the cell's Triton, transformers and the pinned test tools.
# The source is not copied: it is mounted read-only at /src when the cell runs.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON_VERSION
ARG CUDA_VERSION
ARG TORCH_VERSION
ARG TRITON_VERSION
ARG FLA_VERSION
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

# The distribution's own Python: apt versions are not pinned since they move with every point release
# of the base image; the cell's Python minor is asserted instead and the whole stack is pinned via pip.
# The non-root user has a fixed uid so that the host can make the results mount writable for it.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -c "import sys; v = '%d.%d' % sys.version_info[:2]; sys.exit(None if v == '${PYTHON_VERSION}' else f'base image has Python {v}, the cell wants ${PYTHON_VERSION}')" \
    && python3 -m venv /opt/venv \
    && groupadd --gid 10001 gdn \
    && useradd --create-home --no-log-init --uid 10001 --gid 10001 --shell /bin/bash gdn

COPY wheelhouse/ /wheelhouse/
COPY requirements-test.txt /etc/gdn-matrix/requirements-test.txt
# torch from PyTorch's index for the cell's CUDA (13.0 -> cu130): its local label outranks the plain
# build on PyPI, which targets whatever CUDA that release defaults to. Triton goes in afterwards, on
# its own: a cell may pair torch with a Triton other than the one torch pins (cuda-triton39 runs the
# index's latest over torch 2.13), which pip's resolver would refuse. The checks fail the build, not
# the cell, when pip resolved anything but the cell's versions.
RUN pip install --no-cache-dir --progress-bar off --find-links /wheelhouse \
        --extra-index-url "https://download.pytorch.org/whl/cu$(echo "${CUDA_VERSION}" | tr -d .)" \
        "torch==${TORCH_VERSION}" "fla-core==${FLA_VERSION}" "transformers==${TRANSFORMERS_VERSION}" \
        -r /etc/gdn-matrix/requirements-test.txt \
    && pip install --no-cache-dir --progress-bar off --find-links /wheelhouse "triton==${TRITON_VERSION}" \
    && python -c "import sys; from importlib.metadata import version; a = sys.argv[1:]; bad = {p: version(p) for p, w in zip(a[::2], a[1::2]) if version(p).split('+')[0] != w}; sys.exit(f'installed versions differ from the cell: {bad}' if bad else None)" \
        torch "${TORCH_VERSION}" triton "${TRITON_VERSION}" fla-core "${FLA_VERSION}" transformers "${TRANSFORMERS_VERSION}" \
    && python -c "import sys, torch; c = torch.version.cuda or 'none'; sys.exit(None if c == '${CUDA_VERSION}' else f'torch {torch.__version__} is built for CUDA {c}, the cell wants ${CUDA_VERSION}')"

USER 10001:10001
WORKDIR /home/gdn
