# horovod on amd (rocm).
FROM ghcr.io/cascade-ml/base-rocm:0.1
RUN (command -v apt-get >/dev/null && apt-get update && apt-get install -y --no-install-recommends openssh-server openssh-client openmpi-bin libopenmpi-dev && rm -rf /var/lib/apt/lists/*) || true
RUN python3 -m pip install torch==2.4.1 horovod==0.28.1
RUN mkdir -p /etc/cascade /etc/ssh/ssh_config.d && printf 'Port 2222\nHostKey /tmp/ssh_host_ed25519_key\nPidFile /tmp/sshd.pid\nUsePAM no\nStrictModes no\nPasswordAuthentication no\nAuthorizedKeysFile /home/cascade/.ssh/authorized_keys\n' > /etc/cascade/sshd_config && printf 'Host *\n  Port 2222\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n' > /etc/ssh/ssh_config.d/cascade.conf
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
