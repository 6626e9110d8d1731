module spoold.example/lease

go 1.19
