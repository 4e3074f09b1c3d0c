# pytorch on cambricon (mlu).
FROM ghcr.io/cascade-ml/base-mlu:0.1
RUN python3 -m pip install torch==2.1.0 torch-mlu
RUN python3 -m pip install transformers==4.46.3 peft==0.13.2 accelerate==1.1.1
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
