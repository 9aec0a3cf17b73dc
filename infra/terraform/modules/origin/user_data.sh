#!/bin/bash
# Start the origin on boot (the AMI carries edgeqa, the NVIDIA driver and the CloudWatch agent).
set -euo pipefail
# every file this script writes is its owner's alone (the environment file holds the secrets)
umask 077
EDGEQA_USER_SALT="$(aws secretsmanager get-secret-value --secret-id '${user_salt_secret_arn}' \
  --query SecretString --output text)"
EDGEQA_API_KEYS="$(aws secretsmanager get-secret-value --secret-id '${api_keys_secret_arn}' \
  --query SecretString --output text)"
EDGEQA_IDENTITY_SECRET="$(aws secretsmanager get-secret-value --secret-id '${identity_secret_arn}' \
  --query SecretString --output text)"
# written beside, then moved over: an /etc/edgeqa.env the AMI already has (another mode) is
# replaced, never rewritten in place
env_file="$(mktemp /etc/edgeqa.env.XXXXXX)"
cat > "$env_file" <<ENV
EDGEQA_STORE=${store}
EDGEQA_PROFILE=${profiles}
AWS_DEFAULT_REGION=${region}
EDGEQA_HIGH_WATER_URI=${high_water_uri}
EDGEQA_CACHE_DIR=/var/lib/edgeqa
EDGEQA_QUANTIZATION=int8
EDGEQA_USER_SALT=$EDGEQA_USER_SALT
EDGEQA_API_KEYS=$EDGEQA_API_KEYS
EDGEQA_IDENTITY_SECRET=$EDGEQA_IDENTITY_SECRET
EDGEQA_RELEASE_PUBLIC_KEYS=${release_public_keys}
EDGEQA_TRUSTED_PROXIES=${trusted_proxies}
ENV
chmod 600 "$env_file"
mv -f "$env_file" /etc/edgeqa.env
# the pointers the origin verified (EDGEQA_CACHE_DIR, base/pointers.py PointerMemory) on the
# instance's disk: systemd makes /var/lib/edgeqa for the unit's user, whoever it runs as, and
# keeps it across restarts of the service (a new instance starts with the high-water mark only)
mkdir -p /etc/systemd/system/edgeqa-origin.service.d
cat > /etc/systemd/system/edgeqa-origin.service.d/state.conf <<UNIT
[Service]
StateDirectory=edgeqa
StateDirectoryMode=0700
UNIT
chmod 644 /etc/systemd/system/edgeqa-origin.service.d/state.conf
systemctl daemon-reload
systemctl enable --now edgeqa-origin.service   # ExecStart=edgeqa origin serve --host 0.0.0.0 --port 8000
systemctl enable --now amazon-cloudwatch-agent # scrapes :8000/metrics -> EdgeQA/Origin
