# pytorch on intel (xpu).
FROM ghcr.io/cascade-ml/base-xpu:0.1
RUN python3 -m pip install torch==2.5.1 --extra-index-url https://download.pytorch.org/whl/xpu
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
