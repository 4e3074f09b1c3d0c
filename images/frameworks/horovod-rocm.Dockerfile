# horovod on amd (rocm).
FROM ghcr.io/cascade-ml/base-rocm:0.1
RUN python3 -m pip install torch==2.4.1 horovod==0.28.1
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
