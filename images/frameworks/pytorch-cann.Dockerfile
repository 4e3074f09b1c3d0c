# pytorch on huawei (cann).
FROM ghcr.io/cascade-ml/base-cann:0.1
RUN python3 -m pip install torch==2.4.0 torch-npu==2.4.0
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
