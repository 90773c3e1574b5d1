"""The pure domain: migration files, layouts and key mapping, phase rules, versions and
fences, comparison, planning math, capacity rules, leases, wire codecs and IAM policies.

Nothing here imports boto3, botocore, click, tqdm or tenacity (a test checks), so every
rule can be tested with literals.
"""
