package bbs_test

import clientv3 "go.etcd.io/etcd/client/v3"

func clientPrefix() []clientv3.OpOption { return []clientv3.OpOption{clientv3.WithPrefix()} }
