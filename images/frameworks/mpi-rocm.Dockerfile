# mpi on amd (rocm).
FROM ghcr.io/cascade-ml/base-rocm:0.1
RUN (command -v apt-get >/dev/null && apt-get update && apt-get install -y --no-install-recommends openmpi-bin libopenmpi-dev && rm -rf /var/lib/apt/lists/*) || true
RUN python3 -m pip install mpi4py==4.0.0 torch==2.4.1
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
