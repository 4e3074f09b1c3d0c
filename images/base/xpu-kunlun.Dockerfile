# Base layer for xpu-kunlun: Python, pip and an unprivileged user on the vendor's image.
FROM kunlunxin/xpu-base:ubuntu22.04-py3.10
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN (command -v apt-get >/dev/null && apt-get update && apt-get install -y --no-install-recommends \
      python3 python3-pip ca-certificates && rm -rf /var/lib/apt/lists/*) || true
RUN useradd --create-home --uid 1000 cascade || true
WORKDIR /app
