# pytorch on cpu (cpu).
FROM ghcr.io/cascade-ml/base-cpu:0.1
RUN python3 -m pip install torch==2.4.1 --extra-index-url https://download.pytorch.org/whl/cpu
RUN python3 -m pip install transformers==4.46.3 peft==0.13.2 accelerate==1.1.1
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
