"""Everything that talks to DynamoDB: the one choke point for AWS calls
(:mod:`reshard.aws.dynamo`), the read-only table checks (:mod:`reshard.aws.inspect`) and
the embedded local server (:mod:`reshard.aws.local`)."""
