// One Aedes node of the chaos run's comparison cluster (benchmarks/chaos.py --broker aedes):
//   node node.mjs PORT REDIS_PORT NODE_ID
// Sessions, subscriptions, offline and in-flight messages in Redis (aedes-persistence-redis),
// messages between the nodes through Redis pub/sub (mqemitter-redis), both on REDIS_PORT's db 0.
// Listens on 127.0.0.1:PORT and prints "listening" once it does; SIGTERM stops it.
import net from 'node:net'
import { createRequire } from 'node:module'
import { Aedes } from 'aedes'

const require = createRequire(import.meta.url)
const redisPersistence = require('aedes-persistence-redis')
const redisEmitter = require('mqemitter-redis')

const [port, redisPort, nodeId] = process.argv.slice(2)
const redis = { host: '127.0.0.1', port: Number(redisPort), db: 0 }

// Without a listener, mqemitter-redis's 'error' (Redis gone) ends the process: log it instead,
// ioredis reconnects by itself.
const mq = redisEmitter(redis)
mq.state.on('error', (err) => console.error(`mqemitter-redis: ${err.message}`))
const broker = await Aedes.createBroker({
  id: nodeId,
  mq,
  persistence: redisPersistence(redis)
})
broker.on('clientError', () => {})
broker.on('connectionError', () => {})
const server = net.createServer(broker.handle)
server.listen(Number(port), '127.0.0.1', () => console.log(`listening on 127.0.0.1:${port}`))
process.on('SIGTERM', () => {
  server.close()
  broker.close(() => process.exit(0))
  setTimeout(() => process.exit(0), 2000).unref()
})
