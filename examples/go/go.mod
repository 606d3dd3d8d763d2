module example.com/appleid-broker-example

go 1.19
