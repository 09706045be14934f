#!/bin/sh
# Regenerates the OpenSSL-made CA fixtures of tests/signer.rs (OpenSSL 3). They are test keys,
# valid for 100 years, and protect nothing.
set -eu
cd "$(dirname "$0")"
v3() { printf '[req]\ndistinguished_name=dn\n[dn]\n[v3]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\nsubjectKeyIdentifier=hash\n%s\n' "$1"; }

# A root whose key is SEC1 ("EC PRIVATE KEY", after an "EC PARAMETERS" block), as
# `openssl ecparam -genkey` writes it.
openssl ecparam -name prime256v1 -genkey -out openssl-root.sec1.key
v3 'subjectAltName=URI:spiffe://openssl.test' > v3.cnf
openssl req -new -x509 -key openssl-root.sec1.key -days 36500 -config v3.cnf -extensions v3 \
    -subj "/O=openssl.test/CN=openssl.test root CA" -out openssl-root.pem

# An intermediate (PKCS#8 key) signed by that root; the chain file is intermediate then root.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out openssl-intermediate.key
openssl req -new -key openssl-intermediate.key \
    -subj "/O=openssl.test/CN=openssl.test intermediate CA" -out intermediate.csr
printf 'basicConstraints=critical,CA:TRUE,pathlen:0\nkeyUsage=critical,keyCertSign,cRLSign,digitalSignature\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\nsubjectAltName=URI:spiffe://openssl.test\n' > intermediate.ext
openssl x509 -req -in intermediate.csr -CA openssl-root.pem -CAkey openssl-root.sec1.key \
    -CAcreateserial -days 36000 -extfile intermediate.ext -out intermediate.pem
cat intermediate.pem openssl-root.pem > openssl-intermediate-chain.pem

# A root whose subject repeats an attribute type (two OUs), which rcgen cannot reproduce as an
# issuer name.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out openssl-repeated-ou.key
v3 '' > v3.cnf
openssl req -new -x509 -key openssl-repeated-ou.key -days 36500 -config v3.cnf -extensions v3 \
    -subj "/O=openssl.test/OU=mesh/OU=ca/CN=openssl.test repeated OU CA" -out openssl-repeated-ou.pem

rm -f v3.cnf intermediate.csr intermediate.ext intermediate.pem openssl-root.srl
