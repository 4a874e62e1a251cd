#!/bin/sh
# A batch script: options on #WHARF lines, as sbatch reads #SBATCH lines.
#WHARF --job-name=train --cpus=2 --mem=512M --time=10m
#WHARF --image=host
#WHARF --output=train-%j.out
echo "job $WHARF_JOB_ID ($WHARF_JOB_NAME) on $WHARF_NODE with $WHARF_CPUS_ON_NODE CPUs"
for epoch in 1 2 3; do
    echo "epoch $epoch: loss 0.$((10 - epoch))"
    sleep 1
done
echo "allowed CPUs: $(grep Cpus_allowed_list /proc/self/status | cut -f2)"
