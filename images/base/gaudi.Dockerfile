# Base layer for gaudi: Python, pip and an unprivileged user on the vendor's image.
FROM vault.habana.ai/gaudi-docker/1.18.0/ubuntu22.04/habanalabs/pytorch-installer-2.4.0:latest
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN (command -v apt-get >/dev/null && apt-get update && apt-get install -y --no-install-recommends \
      python3 python3-pip ca-certificates && rm -rf /var/lib/apt/lists/*) || true
RUN useradd --create-home --uid 1000 cascade || true
WORKDIR /app
