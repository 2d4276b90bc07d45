"""A moto S3 server on 127.0.0.1 that checks request signatures, for the remote-source tests.

Usage: python3 s3_server.py PORT BUCKET
Starts moto's server in this process, creates an IAM user with an access key (while moto still
accepts unauthenticated requests), creates BUCKET, then turns authentication on for every later
request and prints one line: `READY <access key id> <secret access key>`.
Then reads commands from standard input, one per line, answering `OK` or `ERR <reason>`:
  put KEY FILE     upload FILE as KEY (authenticated, with the key printed above)
  delete KEY       remove KEY
Exits at end of input.
"""

import sys
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import boto3
from moto import settings
from moto.iam.access_control import IAMRequestBase
from moto.server import ThreadedMotoServer


def _canonical_query(create):
    """moto checks signatures against the request's query as the web framework decoded it
    (`prefix=rocm/`), while clients sign the encoded form (`prefix=rocm%2F`), so any listing
    with a `/` in its prefix is refused. Re-encode the query the way SigV4 does before moto
    computes the signature it expects."""

    def wrapped(self):
        request = create(self)
        parts = urlsplit(request.url)
        if parts.query:
            pairs = []
            for pair in parts.query.split("&"):
                k, _, v = pair.partition("=")
                pairs.append(quote(unquote(k), safe="-_.~") + "=" + quote(unquote(v), safe="-_.~"))
            request.url = urlunsplit(parts._replace(query="&".join(pairs)))
        return request

    return wrapped


IAMRequestBase._create_aws_request = _canonical_query(IAMRequestBase._create_aws_request)


def main():
    port, bucket = int(sys.argv[1]), sys.argv[2]
    # Unauthenticated until the key exists; the server shares this module's settings.
    settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boot = dict(endpoint_url=endpoint, region_name="us-east-1",
                aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
    iam = boto3.client("iam", **boot)
    iam.create_user(UserName="kpack")
    iam.put_user_policy(
        UserName="kpack", PolicyName="all",
        PolicyDocument='{"Version":"2012-10-17","Statement":[{"Effect":"Allow",'
                       '"Action":"*","Resource":"*"}]}')
    key = iam.create_access_key(UserName="kpack")["AccessKey"]
    kid, secret = key["AccessKeyId"], key["SecretAccessKey"]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id=kid, aws_secret_access_key=secret)
    s3.create_bucket(Bucket=bucket)
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    print(f"READY {kid} {secret}", flush=True)
    for line in sys.stdin:
        parts = line.split()
        try:
            if parts[0] == "put":
                with open(parts[2], "rb") as f:
                    s3.put_object(Bucket=bucket, Key=parts[1], Body=f.read())
            elif parts[0] == "delete":
                s3.delete_object(Bucket=bucket, Key=parts[1])
            else:
                raise ValueError(f"unknown command {parts[0]}")
            print("OK", flush=True)
        except Exception as e:  # reported to the test, which fails with it
            print(f"ERR {e!r}".replace("\n", " "), flush=True)
    server.stop()


if __name__ == "__main__":
    main()
