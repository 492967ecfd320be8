# The Ascend NPU cells: a CANN image (quay.io/ascend/cann, chosen per cell) and the cell's lock: torch +
# torch_npu + triton-ascend at the versions paired with that CANN, wheelhouse files (fla_npu, a
# triton-ascend that is on no index) with their recorded hashes, transformers and the test tools.
# The source is not copied: it is mounted read-only at /src when the cell runs.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON_VERSION
ARG CANN_VERSION

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The host's CA bundle, not the base image's store: a TLS-intercepting proxy's CA is only on the host.
# GDN_CANN_VERSION records the CANN the cell asked for, beside what the probe finds installed.
COPY ca-bundle.crt /etc/gdn-matrix/ca-bundle.crt
ENV PIP_CERT=/etc/gdn-matrix/ca-bundle.crt \
    SSL_CERT_FILE=/etc/gdn-matrix/ca-bundle.crt \
    REQUESTS_CA_BUNDLE=/etc/gdn-matrix/ca-bundle.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GDN_CANN_VERSION=${CANN_VERSION}

# The CANN image's Python carries CANN's own Python packages, so the stack goes into it (no venv); the
# image tag names the Python minor, asserted here so that a wrong base fails the build, not the cell.
# set_env.sh moved between CANN generations: whichever this image has is linked to one known path.
# The cell command starts `python`, which not every CANN image provides beside python3.
# The non-root user has a fixed uid and gid: a root runner shares the results mount with that group.
RUN python3 -c "import os, sys; v, w = '%d.%d' % sys.version_info[:2], os.environ['PYTHON_VERSION']; sys.exit(None if v == w else f'base image has Python {v}, the cell wants {w}')" \
    && for env in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/cann/set_env.sh; do \
        if [ -f "$env" ]; then ln -s "$env" /etc/cann-set_env.sh; break; fi; \
    done \
    && test -e /etc/cann-set_env.sh \
    && { command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python; } \
    && groupadd --gid 10001 gdn \
    && useradd --create-home --no-log-init --uid 10001 --gid 10001 --shell /bin/bash gdn

COPY wheelhouse/ /wheelhouse/
COPY lock.txt /etc/gdn-matrix/lock.txt
# Exactly the lock, every file checked against its recorded hash and nothing resolved here. PyPI's
# aarch64 torch is a CPU build (no CUDA wheels in the lock), which torch_npu runs over; the wheelhouse
# files are hashed lines of the lock, found in /wheelhouse.
RUN python3 -m pip install --no-cache-dir --progress-bar off --require-hashes --no-deps --find-links /wheelhouse \
        -r /etc/gdn-matrix/lock.txt

USER 10001:10001
WORKDIR /home/gdn
# fla_npu and torch_npu need CANN's environment (library paths, ASCEND_* variables) in the process that
# imports them: the cell's command runs through this shell, which sources set_env.sh and then execs it.
ENTRYPOINT ["/bin/bash", "-c", "source /etc/cann-set_env.sh && exec \"$@\"", "--"]
